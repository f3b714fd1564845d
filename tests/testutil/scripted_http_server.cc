#include "tests/testutil/scripted_http_server.h"

#include "nlohmann/json.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <sstream>

namespace kforge::testing {

ScriptedHttpServer::ScriptedHttpServer() {
  listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  listen(listen_fd_, 16);
  thread_ = std::thread([this] { Serve(); });
}

ScriptedHttpServer::~ScriptedHttpServer() {
  stop_ = true;
  thread_.join();
  for (auto& t : handlers_) t.join();
  close(listen_fd_);
}

void ScriptedHttpServer::Push(ScriptedResponse r) {
  std::lock_guard<std::mutex> lock(mu_);
  script_.push_back(std::move(r));
}

std::vector<ReceivedRequest> ScriptedHttpServer::requests() {
  std::lock_guard<std::mutex> lock(mu_);
  return received_;
}

void ScriptedHttpServer::Serve() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    int fd = accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) continue;
    handlers_.emplace_back([this, fd] { Handle(fd); });
  }
}

void ScriptedHttpServer::Handle(int fd) {
  {
    // Read the head, then the body by Content-Length.
    std::string data;
    char buf[8192];
    size_t head_end = std::string::npos;
    while (head_end == std::string::npos) {
      ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      data.append(buf, static_cast<size_t>(n));
      head_end = data.find("\r\n\r\n");
    }
    if (head_end == std::string::npos) {
      close(fd);
      return;
    }
    ReceivedRequest req;
    std::istringstream head(data.substr(0, head_end));
    std::string line;
    std::getline(head, line);
    std::istringstream first(line);
    first >> req.method >> req.path;
    size_t content_length = 0;
    while (std::getline(head, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      req.headers[name] = value;
      if (name == "content-length") content_length = std::stoul(value);
    }
    req.body = data.substr(head_end + 4);
    while (req.body.size() < content_length) {
      ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      req.body.append(buf, static_cast<size_t>(n));
    }
    ScriptedResponse r;
    {
      std::lock_guard<std::mutex> lock(mu_);
      received_.push_back(req);
      if (script_.empty()) {
        r.status = 500;
        r.body = "no scripted response";
      } else {
        r = script_.front();
        script_.pop_front();
      }
    }
    if (r.delay_ms > 0) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(r.delay_ms);
      while (!stop_ && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::string out = "HTTP/1.1 " + std::to_string(r.status) + " Scripted\r\nConnection: close\r\nContent-Length: " +
                      std::to_string(r.body.size()) + "\r\n";
    for (const auto& [k, v] : r.headers) out += k + ": " + v + "\r\n";
    out += "\r\n";
    out += r.truncate ? r.body.substr(0, r.body.size() / 2) : r.body;
    send(fd, out.data(), out.size(), MSG_NOSIGNAL);
    close(fd);
  }
}

std::string OpenAiChatReply(const std::string& text, int input_tokens, int output_tokens) {
  return nlohmann::json{{"choices", {{{"message", {{"role", "assistant"}, {"content", text}}}}}},
                        {"usage", {{"prompt_tokens", input_tokens}, {"completion_tokens", output_tokens}}}}
      .dump();
}

}  // namespace kforge::testing

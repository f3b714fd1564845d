#include "cli/health_command.h"

#include <chrono>
#include <iostream>

#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace kforge::cli {

namespace {

// grpc.health.v1 messages, by hand (Debian ships no generated client for them):
// HealthCheckRequest { string service = 1; }, HealthCheckResponse { ServingStatus status = 1; }.
std::string EncodeRequest(const std::string& service) {
  if (service.empty()) return "";
  std::string out = "\x0a";  // field 1, length-delimited
  for (size_t n = service.size();; n >>= 7) {
    if (n < 0x80) {
      out += static_cast<char>(n);
      break;
    }
    out += static_cast<char>((n & 0x7f) | 0x80);
  }
  return out + service;
}

// The status field (0 when absent: UNKNOWN).
int DecodeStatus(const std::string& bytes) {
  if (bytes.size() >= 2 && bytes[0] == '\x08') return static_cast<unsigned char>(bytes[1]) & 0x7f;
  return 0;
}

const char* StatusName(int status) {
  switch (status) {
    case 1:
      return "SERVING";
    case 2:
      return "NOT_SERVING";
    case 3:
      return "SERVICE_UNKNOWN";
    default:
      return "UNKNOWN";
  }
}

}  // namespace

int HealthCommand(const HealthArgs& args) {
  auto credentials = ChannelCredentialsFor(args.tls);
  if (!credentials.ok()) {
    std::cerr << "kforge health: " << credentials.status().message() << "\n";
    return 2;
  }
  auto channel = grpc::CreateChannel(args.server, *credentials);
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(args.timeout_seconds * 1000)));
  const std::string request = EncodeRequest(args.service);
  grpc::Slice slice(request);
  grpc::ByteBuffer request_buffer(&slice, 1);
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request_buffer, &cq);
  grpc::ByteBuffer response;
  grpc::Status status;
  call->StartCall();
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (!status.ok()) {
    std::cout << "kforge health: " << args.server << ": " << status.error_message() << " (code "
              << static_cast<int>(status.error_code()) << ")\n";
    return 1;
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok()) {
    for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  const int serving = DecodeStatus(bytes);
  std::cout << args.server << (args.service.empty() ? "" : " " + args.service) << ": " << StatusName(serving)
            << "\n";
  return serving == 1 ? 0 : 1;
}

}  // namespace kforge::cli

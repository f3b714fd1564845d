#pragma once

// PostgresStore's connections (a pool of libpqxx connections) and its transactions: what every
// file of the store runs its statements through. Internal to the store's .cc files.

#include <algorithm>
#include <chrono>
#include <pqxx/pqxx>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/store/postgres_store.h"

namespace kforge {

struct PostgresStore::Conn {
  explicit Conn(const std::string& url) : c(url) {}
  pqxx::connection c;
};

template <typename T, typename Fn>
absl::StatusOr<T> PostgresStore::WithTransaction(const char* what, Fn fn, double window_seconds,
                                                 bool single_statement) {
  const double window = window_seconds >= 0 ? window_seconds : options_.reconnect_seconds;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(window);
  double backoff = 0.05;
  absl::Status last;
  for (int attempt = 1;; ++attempt) {
    if (attempt > 1) {
      if (std::chrono::steady_clock::now() >= until) {
        return absl::UnavailableError(
            absl::StrCat(display_, ": ", what, ": the database did not come back within ",
                         options_.reconnect_seconds, " s (", last.message(), ")"));
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
      backoff = std::min(backoff * 2, 1.0);
    }
    absl::Status take_error;
    std::unique_ptr<Conn> c = Take(&take_error);
    if (c == nullptr) {
      last = take_error;
      continue;
    }
    try {
      // One statement needs no BEGIN / COMMIT round trips: it is atomic on its own.
      std::unique_ptr<pqxx::transaction_base> w;
      if (single_statement) {
        w = std::make_unique<pqxx::nontransaction>(c->c);
      } else {
        w = std::make_unique<pqxx::work>(c->c);
      }
      absl::StatusOr<T> r = fn(*w, attempt);
      if (r.ok()) {
        w->commit();
      } else {
        w->abort();
      }
      w.reset();
      Give(std::move(c));
      return r;
    } catch (const pqxx::broken_connection& e) {
      last = absl::UnavailableError(e.what());
      c.reset();  // reopened on the next attempt
    } catch (const pqxx::in_doubt_error& e) {
      // The commit may or may not have happened: the retry's idempotence decides.
      last = absl::UnavailableError(e.what());
      c.reset();
    } catch (const pqxx::sql_error& e) {
      // The server refused the statement. A server shutting down (admin_shutdown, 57P01) or
      // not yet accepting (cannot_connect_now, 57P03) is transient; anything else is not.
      const std::string state = e.sqlstate();
      if (absl::StartsWith(state, "57P") || absl::StartsWith(state, "08")) {
        last = absl::UnavailableError(e.what());
        c.reset();
        Give(nullptr);
        continue;
      }
      Give(std::move(c));
      return absl::InternalError(absl::StrCat(display_, ": ", what, ": ", e.what()));
    } catch (const std::exception& e) {
      Give(nullptr);
      return absl::InternalError(absl::StrCat(display_, ": ", what, ": ", e.what()));
    }
    Give(nullptr);
  }
}

}  // namespace kforge

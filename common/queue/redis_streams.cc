#include "common/queue/redis_streams.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/queue/redis_client.h"

namespace kforge::redis_streams {

int64_t Millis(double seconds) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::llround(seconds * 1000)));
}

bool ParseDeliveryId(const std::string& delivery_id, std::string* entry_id, int* deliveries) {
  std::pair<std::string, std::string> parts = absl::StrSplit(delivery_id, absl::MaxSplits('/', 1));
  *entry_id = parts.first;
  return !entry_id->empty() && absl::SimpleAtoi(parts.second, deliveries);
}

const redisReply* ReadEntries(const redisReply& r) {
  if (r.type != REDIS_REPLY_ARRAY || r.elements == 0) return nullptr;
  const redisReply* stream = r.element[0];
  if (stream->type != REDIS_REPLY_ARRAY || stream->elements < 2) return nullptr;
  const redisReply* entries = stream->element[1];
  if (entries->type != REDIS_REPLY_ARRAY || entries->elements == 0) return nullptr;
  return entries;
}

const redisReply* FirstReadEntry(const redisReply& r) {
  const redisReply* entries = ReadEntries(r);
  return entries == nullptr ? nullptr : entries->element[0];
}

bool EntryField(const redisReply& entry, const char* field, std::string* id, std::string* value) {
  if (entry.type != REDIS_REPLY_ARRAY || entry.elements < 2 ||
      entry.element[0]->type != REDIS_REPLY_STRING) {
    return false;
  }
  *id = RedisString(*entry.element[0]);
  const redisReply* fields = entry.element[1];
  if (fields->type != REDIS_REPLY_ARRAY) return false;
  for (size_t i = 0; i + 1 < fields->elements; i += 2) {
    if (fields->element[i]->type == REDIS_REPLY_STRING &&
        RedisString(*fields->element[i]) == field &&
        fields->element[i + 1]->type == REDIS_REPLY_STRING) {
      *value = RedisString(*fields->element[i + 1]);
      return true;
    }
  }
  return false;
}

}  // namespace kforge::redis_streams

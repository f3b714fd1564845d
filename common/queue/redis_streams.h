#pragma once

// What both sides of RedisWorkQueue share about its Redis Streams: the consumer groups' names, the
// longest blocking read, and the shapes of the stream replies they parse.

#include <hiredis/hiredis.h>

#include <cstdint>
#include <string>

namespace kforge::redis_streams {

// Consumer groups: the workers' on a work stream, the coordinators' on a job's result stream.
inline constexpr char kWorkers[] = "workers";
inline constexpr char kCoordinators[] = "coordinators";
inline constexpr double kSliceSeconds = 0.1;  // longest blocking read: Close latency

// Seconds as the whole milliseconds Redis takes (at least 1).
int64_t Millis(double seconds);

// A delivery id, "<entry id>/<delivery count>".
bool ParseDeliveryId(const std::string& delivery_id, std::string* entry_id, int* deliveries);

// The entries array of an XREADGROUP reply on one stream ([[key, [[id, [f, v, ...]], ...]]]);
// nullptr when there are none.
const redisReply* ReadEntries(const redisReply& r);

// The first entry of an XREADGROUP reply, or nullptr.
const redisReply* FirstReadEntry(const redisReply& r);

// An entry [id, [field, value, ...]]: its id and the value of `field` ("" and false if absent).
bool EntryField(const redisReply& entry, const char* field, std::string* id, std::string* value);

}  // namespace kforge::redis_streams

#include "services/llm-proxy/proxy_config.h"

#include "absl/strings/str_cat.h"

namespace kforge::llm {

namespace {

ConfigSchema::Check InRange(const int64_t* value, int64_t lo, int64_t hi) {
  return [value, lo, hi] {
    return *value >= lo && *value <= hi ? std::string() : absl::StrCat("must be between ", lo, " and ", hi);
  };
}

}  // namespace

void AddProxyFields(ConfigSchema& schema, ProxyOptions& opts) {
  AddServerFields(schema, opts.server, "127.0.0.1:7071", "127.0.0.1:9471");
  schema.Add("llm.providers_file", &opts.providers_file,
             "YAML file of model providers; empty = parametric mutator only");
  schema.Add("llm.cache_dir", &opts.cache_dir,
             "folder of the model replies file (replies.jsonl, created if missing): a restarted proxy "
             "replays what it recorded; empty = memory only (or the providers file's cache_file)");
  schema.Add("llm.probability", &opts.llm_probability,
             "share of mutations asked of a model when one is configured", [&opts] {
               return opts.llm_probability >= 0 && opts.llm_probability <= 1
                          ? std::string()
                          : std::string("must be between 0 and 1");
             });
  schema.Add("auth.token_file", &opts.token_file,
             "file holding the bearer token callers (the coordinators) must present; empty: no check");
  schema.Add("proxy.threads", &opts.threads, "worker threads: mutations running at once",
             InRange(&opts.threads, 1, 1024));
  schema.Add("proxy.queue", &opts.queue,
             "mutations waiting for a thread; a request beyond that is refused (RESOURCE_EXHAUSTED)",
             InRange(&opts.queue, 0, 1 << 20));
  schema.Add("proxy.max_count", &opts.max_count,
             "most children one request may ask for (the coordinator asks up to 512 per global draw)",
             InRange(&opts.max_count, 1, 1 << 20));
  schema.Add("proxy.cached_spaces", &opts.cached_spaces,
             "problems whose parsed search spaces stay cached (least recently used go first)",
             InRange(&opts.cached_spaces, 1, 1 << 20));
  schema.Add(
      "proxy.memo_variants", &opts.memo_variants,
      "knob variants whose validity and hash the parametric mutator remembers (a few hundred "
      "bytes each; 0: none)",
      InRange(&opts.memo_variants, 0, 1 << 24));
}

}  // namespace kforge::llm

#include "launcher/run_output.hpp"

#include <optional>
#include <set>

#include <unistd.h>

#include "launcher/torchrun_compat.hpp"
#include "sys/exit_codes.hpp"

namespace lspawn::cli {
namespace {

// torchrun's --redirects/--tee: passes on to `inner` only the (rank, stream)s `pass` selects.
class RoutedSink : public OutputSink {
 public:
  RoutedSink(OutputSink& inner, std::function<bool(int rank, Stream)> pass) : inner_(inner), pass_(std::move(pass)) {}
  void bytes(int rank, Stream stream, std::string_view data) override {
    if (pass_(rank, stream)) inner_.bytes(rank, stream, data);
  }
  void line(int rank, Stream stream, std::string_view line) override {
    if (pass_(rank, stream)) inner_.line(rank, stream, line);
  }
  void closed(int rank, Stream stream) override {
    if (pass_(rank, stream)) inner_.closed(rank, stream);
  }
  void begin_lines() override { inner_.begin_lines(); }
  void end_lines() override { inner_.end_lines(); }

 private:
  OutputSink& inner_;
  std::function<bool(int, Stream)> pass_;
};

// torchrun's --redirects/--tee and --local-ranks-filter: where a rank's stream goes. Every node
// runs as many workers, so a rank's local rank is rank % nproc.
struct StdRouting {
  StdSpec redirects;
  StdSpec tee;
  int nproc = 1;
  std::optional<std::set<int>> filter;  // --local-ranks-filter

  StdRoute operator()(int rank, Stream s) const {
    const StdRoute r = std_route(redirects, tee, rank % nproc, s == Stream::Stderr);
    return filter ? filter_route(r, *filter, rank % nproc) : r;
  }
};

StdRouting std_routing(const CliOptions& o) {
  StdRouting routing;
  routing.redirects = o.redirects.value_or(StdSpec{});
  routing.tee = o.tee_spec.value_or(StdSpec{});
  if (!o.tee_spec && o.tee) routing.tee.all = 3;  // the boolean --tee: every stream
  routing.nproc = o.nproc_per_node;
  routing.filter = o.local_ranks_filter;
  return routing;
}

// A failed rank whose output is not on the console: the report says where it is.
std::string output_note(const StdRouting& routing, const LogDirSink& logs, int rank) {
  std::string files;
  for (Stream s : {Stream::Stdout, Stream::Stderr}) {
    const StdRoute r = routing(rank, s);
    const std::string path = logs.path(rank, s);
    if (r.file && !r.console && ::access(path.c_str(), F_OK) == 0) files += (files.empty() ? "" : ", ") + path;
  }
  return files.empty() ? std::string() : "its output, not on the console: " + files;
}

// Replaces out.sinks by the console's and the files' routed shares.
void route_sinks(const CliOptions& o, RunOutput& out) {
  const StdRouting routing = std_routing(o);
  out.sinks.clear();
  out.routes.push_back(
      std::make_unique<RoutedSink>(*out.console, [routing](int r, Stream s) { return routing(r, s).console; }));
  if (out.logs) {
    out.routes.push_back(
        std::make_unique<RoutedSink>(*out.logs, [routing](int r, Stream s) { return routing(r, s).file; }));
    out.output_note = [routing, logs = out.logs.get()](int rank) { return output_note(routing, *logs, rank); };
  }
  for (auto& r : out.routes) out.sinks.push_back(r.get());
}

ConsoleSink::Options console_options(const CliOptions& o, const std::string& host) {
  ConsoleSink::Options co;
  co.prefix = o.prefix;
  if (o.nnodes > 1) co.host = host;
  if (!o.log_line_prefix_template.empty()) {
    // torchrun's --log-line-prefix-template; a rank's local rank is rank % nproc on every node.
    co.prefix_of = [tmpl = o.log_line_prefix_template, role = o.role, nproc = o.nproc_per_node, host](int rank) {
      return expand_prefix_template(tmpl, PrefixFields{role, rank, rank % nproc, host});
    };
  }
  return co;
}

}  // namespace

void RunOutput::set_attempt(int round) {
  if (logs) logs->set_attempt(round);
  if (filtered) filtered->set_attempt(round);
}

RunOutput make_run_output(const CliOptions& o, const std::string& host,
                          const std::function<void(const std::string&)>& warn) {
  RunOutput out;
  const bool routed = o.redirects || o.tee_spec || o.local_ranks_filter;
  const ConsoleSink::Options co = console_options(o, host);
  if (o.log_dir.empty() || o.tee || routed) {
    out.console = std::make_unique<ConsoleSink>(co);
    out.sinks.push_back(out.console.get());
  }
  if (!o.log_dir.empty()) {
    out.logs = std::make_unique<LogDirSink>(o.log_dir, warn);
    out.sinks.push_back(out.logs.get());
  }
  // torchrun's --redirects/--tee and --local-ranks-filter decide, per local rank and stream,
  // console, files or both.
  if (routed) route_sinks(o, out);
  if (!o.filtered_dir.empty()) {
    // Every line of every local rank is matched, wherever --redirects/--tee send it; the copies
    // carry the console's prefix even under --no-prefix, as one file holds every rank.
    ConsoleSink::Options fo = co;
    fo.prefix = true;
    try {
      out.filtered = std::make_unique<FilteredCopySink>(
          o.filtered_dir, o.duplicate_filters[0], o.duplicate_filters[1],
          [fo](int rank) { return console_prefix(fo, rank); }, warn);
    } catch (const sys::SysError& e) {
      throw UsageError("--duplicate-stdout/stderr-filters: " + std::string(e.what()));
    }
    out.sinks.push_back(out.filtered.get());
  }
  return out;
}

}  // namespace lspawn::cli

#include "gpu/visible_devices.h"

#include <algorithm>
#include <cctype>

namespace ctrun {
namespace {

std::string Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

// strtoul's reading of a leading number: digits after an optional sign; -1 when none or negative.
long LeadingNumber(const std::string& s) {
  size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  const size_t digits_start = i;
  long v = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])) && v < 1000000) v = v * 10 + (s[i++] - '0');
  if (i == digits_start || negative) return -1;
  return v;
}

bool StartsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// Index into `devices` of the one device (or MIG instance's parent) whose UUID starts with
// `entry`: -1 none, -2 more than one.
int FindByUuid(const std::string& entry, const std::vector<GpuDevice>& devices) {
  int found = -1;
  for (size_t i = 0; i < devices.size(); ++i) {
    bool match = !devices[i].uuid.empty() && StartsWith(devices[i].uuid, entry);
    for (const auto& mig : devices[i].mig_uuids) match = match || StartsWith(mig, entry);
    if (!match) continue;
    if (found >= 0) return -2;
    found = static_cast<int>(i);
  }
  return found;
}

}  // namespace

std::vector<std::string> SplitCommas(std::string_view value) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t end = value.find(',', start);
    out.push_back(Trim(value.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start)));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return out;
}

VisibleDevicesSpec ParseVisibleDevices(std::string_view value) {
  VisibleDevicesSpec spec;
  const std::vector<std::string> items = SplitCommas(value);  // trimmed, never empty
  const std::string& first = items.front();
  const char* prefix = StartsWith(first, "GPU-") ? "GPU-" : StartsWith(first, "MIG-") ? "MIG-" : nullptr;
  spec.kind = prefix ? VisibleDevicesSpec::Kind::kUuids : VisibleDevicesSpec::Kind::kOrdinals;
  for (const std::string& item : items) {
    if (prefix) {
      if (!StartsWith(item, prefix)) break;
      if (std::find(spec.entries.begin(), spec.entries.end(), item) != spec.entries.end()) {
        spec.hides_all = true;
        break;
      }
      spec.entries.push_back(item);
      continue;
    }
    const long n = LeadingNumber(item);
    if (n < 0) break;
    if (std::find(spec.ordinals.begin(), spec.ordinals.end(), n) != spec.ordinals.end()) {
      spec.hides_all = true;
      break;
    }
    spec.ordinals.push_back(static_cast<int>(n));
    spec.entries.push_back(item);
  }
  if (spec.hides_all) {
    spec.entries.clear();
    spec.ordinals.clear();
  }
  return spec;
}

std::vector<int> ResolveVisibleDevices(const VisibleDevicesSpec& spec, const std::vector<GpuDevice>& devices) {
  std::vector<int> out;
  if (spec.kind == VisibleDevicesSpec::Kind::kOrdinals) {
    for (int o : spec.ordinals) {
      auto it = std::find_if(devices.begin(), devices.end(), [o](const GpuDevice& d) { return d.ordinal == o; });
      if (it == devices.end()) break;
      out.push_back(static_cast<int>(it - devices.begin()));
    }
    return out;
  }
  for (const std::string& e : spec.entries) {
    const int i = FindByUuid(e, devices);
    if (i == -2) return {};  // ambiguous: the runtime sees nothing
    if (i < 0) break;
    if (std::find(out.begin(), out.end(), i) != out.end() && !StartsWith(e, "MIG-")) return {};
    out.push_back(i);
  }
  return out;
}

}  // namespace ctrun

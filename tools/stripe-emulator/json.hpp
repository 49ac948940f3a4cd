// JSON output for every response body, and a small parser for the control
// API's request bodies. Kept separate from the rest of billguard on purpose:
// the emulator must not share code with the client it is testing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace stripe_emulator {

// Appends `text` as a quoted JSON string. Invalid UTF-8 bytes become U+FFFD,
// so a response stays valid JSON whatever bytes a client put in metadata.
void append_json_string(std::string& out, std::string_view text);

// Streaming writer. Commas are placed here, not by callers, so object
// renderers cannot produce malformed JSON by forgetting one.
class JsonWriter {
 public:
  JsonWriter& begin_object();
  JsonWriter& end_object();
  JsonWriter& begin_array();
  JsonWriter& end_array();
  JsonWriter& key(std::string_view name);
  JsonWriter& string(std::string_view text);
  JsonWriter& optional_string(const std::optional<std::string>& text);  // null when empty
  JsonWriter& integer(std::int64_t number);
  JsonWriter& optional_integer(const std::optional<std::int64_t>& number);  // null when empty
  JsonWriter& boolean(bool flag);
  JsonWriter& null();
  JsonWriter& raw(std::string_view rendered_json);  // a value rendered elsewhere

  std::string take() { return std::move(out_); }

 private:
  void separate_from_previous_value();

  std::string out_;
  std::vector<bool> container_has_items_;
  bool value_completes_member_ = false;
};

// A parsed JSON document. Numbers keep an exact integer when they are one,
// because every number the control API takes is a count or a duration.
struct JsonValue {
  enum class Type { null, boolean, number, string, array, object };

  Type type = Type::null;
  bool boolean_value = false;
  double number_value = 0;
  bool is_integer = false;
  std::int64_t integer_value = 0;
  std::string string_value;
  std::vector<JsonValue> array_items;
  std::vector<std::pair<std::string, JsonValue>> object_members;

  const JsonValue* member(std::string_view name) const;  // last one wins, like most parsers
};

// Parses a whole document; on failure returns nullopt and describes why.
std::optional<JsonValue> parse_json(std::string_view text, std::string& error);

}  // namespace stripe_emulator

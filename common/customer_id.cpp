// The character rule of a customer id (see customer_id.hpp).
#include "cpp_only.hpp"

#include "customer_id.hpp"

#include <algorithm>
#include <iterator>
#include <optional>

#include "key_derivation.hpp"
#include "utf8.hpp"

namespace billguard {

namespace {

struct CodePointRange {
  char32_t first;
  char32_t last;
};

// White_Space, General_Category=Cf and Default_Ignorable_Code_Point of
// Unicode 15, merged into sorted, disjoint ranges.
constexpr CodePointRange kBlankOrInvisible[] = {
    {0x0009, 0x000D},    // tab, line feed, vertical tab, form feed, carriage return
    {0x0020, 0x0020},    // space
    {0x0085, 0x0085},    // next line
    {0x00A0, 0x00A0},    // no-break space
    {0x00AD, 0x00AD},    // soft hyphen
    {0x034F, 0x034F},    // combining grapheme joiner
    {0x0600, 0x0605},    // Arabic number signs
    {0x061C, 0x061C},    // Arabic letter mark
    {0x06DD, 0x06DD},    // Arabic end of ayah
    {0x070F, 0x070F},    // Syriac abbreviation mark
    {0x0890, 0x0891},    // Arabic pound and piastre marks above
    {0x08E2, 0x08E2},    // Arabic disputed end of ayah
    {0x115F, 0x1160},    // Hangul choseong and jungseong fillers
    {0x1680, 0x1680},    // Ogham space mark
    {0x17B4, 0x17B5},    // Khmer inherent vowels
    {0x180B, 0x180F},    // Mongolian free variation selectors, vowel separator
    {0x2000, 0x200F},    // en quad .. hair space, zero width space .. right-to-left mark
    {0x2028, 0x202F},    // line and paragraph separators, bidi embeddings, narrow no-break space
    {0x205F, 0x206F},    // medium mathematical space, word joiner .. invisible plus, bidi isolates
    {0x3000, 0x3000},    // ideographic space
    {0x3164, 0x3164},    // Hangul filler
    {0xFE00, 0xFE0F},    // variation selectors
    {0xFEFF, 0xFEFF},    // zero width no-break space (byte order mark)
    {0xFFA0, 0xFFA0},    // halfwidth Hangul filler
    {0xFFF0, 0xFFFB},    // reserved default-ignorables, interlinear annotation
    {0x110BD, 0x110BD},  // Kaithi number sign
    {0x110CD, 0x110CD},  // Kaithi number sign above
    {0x13430, 0x1343F},  // Egyptian hieroglyph format controls
    {0x1BCA0, 0x1BCA3},  // shorthand format controls
    {0x1D173, 0x1D17A},  // musical symbol format controls
    {0xE0000, 0xE0FFF},  // tags, variation selectors supplement, reserved
};

// Control characters (Cc): C0, DEL and C1.
bool IsControl(char32_t c) {
  return c < 0x20 || (c >= 0x7F && c <= 0x9F);
}

}  // namespace

bool IsBlankOrInvisible(char32_t code_point) {
  const auto* range =
      std::upper_bound(std::begin(kBlankOrInvisible), std::end(kBlankOrInvisible), code_point,
                       [](char32_t c, const CodePointRange& r) { return c < r.first; });
  return range != std::begin(kBlankOrInvisible) && code_point <= std::prev(range)->last;
}

bool IsValidCustomerIdText(std::string_view customer_id, CustomerIdCharset charset) {
  if (customer_id.empty() || customer_id.size() > kMaxCustomerIdBytes) return false;
  const char32_t highest = charset == CustomerIdCharset::kAsciiOnly ? 0x7F : 0x10FFFF;
  std::optional<char32_t> first;
  char32_t last = 0;
  for (std::size_t position = 0; position < customer_id.size();) {
    const std::optional<char32_t> c = NextCodePoint(customer_id, &position);
    if (!c || *c > highest || IsControl(*c)) return false;
    if (!first) first = c;
    last = *c;
  }
  return !IsBlankOrInvisible(*first) && !IsBlankOrInvisible(last);
}

}  // namespace billguard

// Unit tests of the customer id character rule (common/customer_id.cpp),
// printing TAP. The code points below are written out from the Unicode
// tables independently of the rule's own range list.
#include <cstdio>
#include <string>
#include <vector>

#include "customer_id.hpp"
#include "tap.hpp"

namespace {

using billguard::CustomerIdCharset;
using tap::Ok;

std::string Utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

bool Valid(const std::string& id, CustomerIdCharset charset = CustomerIdCharset::kUnicode) {
  return billguard::IsValidCustomerIdText(id, charset);
}

std::string Hex(char32_t c) {
  char buffer[16];
  std::snprintf(buffer, sizeof(buffer), "U+%04X", static_cast<unsigned>(c));
  return buffer;
}

void AddRange(std::vector<char32_t>& to, char32_t first, char32_t last) {
  for (char32_t c = first; c <= last; ++c) to.push_back(c);
}

// Every code point the rule must refuse at either end of an id.
std::vector<char32_t> BlankOrInvisible() {
  std::vector<char32_t> v;
  // White_Space.
  AddRange(v, 0x0009, 0x000D);
  for (char32_t c : {0x0020, 0x0085, 0x00A0, 0x1680}) v.push_back(c);
  AddRange(v, 0x2000, 0x200A);
  for (char32_t c : {0x2028, 0x2029, 0x202F, 0x205F, 0x3000}) v.push_back(c);
  // Format characters (Cf): soft hyphen, zero width and direction marks,
  // bidi embeddings and isolates, word joiner and invisible operators,
  // byte order mark, Mongolian vowel separator, Arabic and other signs,
  // interlinear annotation, tags.
  for (char32_t c : {0x00AD, 0x061C, 0x06DD, 0x070F, 0x08E2, 0x180E, 0xFEFF}) v.push_back(c);
  AddRange(v, 0x0600, 0x0605);
  AddRange(v, 0x0890, 0x0891);
  AddRange(v, 0x200B, 0x200F);
  AddRange(v, 0x202A, 0x202E);
  AddRange(v, 0x2060, 0x2064);
  AddRange(v, 0x2066, 0x206F);
  AddRange(v, 0xFFF9, 0xFFFB);
  for (char32_t c : {0x110BD, 0x110CD, 0xE0001}) v.push_back(c);
  AddRange(v, 0x13430, 0x1343F);
  AddRange(v, 0x1BCA0, 0x1BCA3);
  AddRange(v, 0x1D173, 0x1D17A);
  AddRange(v, 0xE0020, 0xE007F);
  // Default-ignorables that render as nothing: Hangul fillers, combining
  // grapheme joiner, Khmer inherent vowels, variation selectors.
  for (char32_t c : {0x115F, 0x1160, 0x3164, 0xFFA0, 0x034F, 0x17B4, 0x17B5, 0x2065}) {
    v.push_back(c);
  }
  AddRange(v, 0x180B, 0x180F);
  AddRange(v, 0xFE00, 0xFE0F);
  AddRange(v, 0xE0100, 0xE01EF);
  return v;
}

}  // namespace

int main() {
  const std::vector<char32_t> refused = BlankOrInvisible();

  // ASCII.
  Ok(Valid("cust_1"), "cust_1 is valid");
  Ok(Valid("x'); DROP TABLE billguard.accounts; --"), "punctuation and interior spaces are valid");
  std::string printable;
  for (char c = 0x21; c < 0x7F; ++c) printable += c;
  Ok(Valid(printable), "every printable ASCII character is valid");
  Ok(!Valid(""), "the empty id is refused");
  Ok(Valid(std::string(255, 'x')), "255 bytes are valid");
  Ok(!Valid(std::string(256, 'x')), "256 bytes are refused");
  Ok(!Valid(" cust_1") && !Valid("cust_1 ") && !Valid(" "),
     "a leading or trailing space is refused");
  bool controls_refused = true;
  for (char32_t c = 0; c < 0x20; ++c) {
    controls_refused = controls_refused && !Valid("cu" + Utf8(c) + "st");
  }
  Ok(controls_refused && !Valid("cu\x7Fst"), "an ASCII control character anywhere is refused");
  Ok(!Valid(std::string("cu\0st", 5)), "a NUL byte is refused");

  // Unicode.
  Ok(Valid("ü") && Valid("日本_42") && Valid("straße") && Valid("Ωmega"),
     "visible non-ASCII letters are valid");
  Ok(Valid("cust" + Utf8(0x00A0) + "1") && Valid("cust" + Utf8(0x200B) + "1"),
     "a blank or invisible character inside an id is allowed");
  bool c1_refused = true;
  for (char32_t c = 0x80; c <= 0x9F; ++c) c1_refused = c1_refused && !Valid("cu" + Utf8(c) + "st");
  Ok(c1_refused, "a C1 control character anywhere is refused");

  std::string leading_accepted;
  std::string trailing_accepted;
  std::string alone_accepted;
  for (char32_t c : refused) {
    if (Valid(Utf8(c) + "cust_1")) leading_accepted += Hex(c) + " ";
    if (Valid("cust_1" + Utf8(c))) trailing_accepted += Hex(c) + " ";
    if (Valid(Utf8(c))) alone_accepted += Hex(c) + " ";
  }
  Ok(refused.size() > 400, "the list of blank or invisible code points is complete enough");
  Ok(leading_accepted.empty(),
     "every blank or invisible code point is refused at the start " + leading_accepted);
  Ok(trailing_accepted.empty(),
     "every blank or invisible code point is refused at the end " + trailing_accepted);
  Ok(alone_accepted.empty(),
     "an id of one blank or invisible code point is refused " + alone_accepted);
  Ok(!Valid("cust_1" + Utf8(0x00A0)) && !Valid("cust_1" + Utf8(0x2003)) &&
         !Valid(Utf8(0x3000) + "cust_1"),
     "the reported look-alikes of cust_1 (U+00A0, U+2003 after, U+3000 before) are refused");
  bool classified = true;
  for (char32_t c : refused) classified = classified && billguard::IsBlankOrInvisible(c);
  Ok(classified, "IsBlankOrInvisible holds for every listed code point");
  Ok(!billguard::IsBlankOrInvisible('a') && !billguard::IsBlankOrInvisible(0x00E9) &&
         !billguard::IsBlankOrInvisible(0x2800) && !billguard::IsBlankOrInvisible(0x1F600) &&
         !billguard::IsBlankOrInvisible(0xE1000) && !billguard::IsBlankOrInvisible(0x10FFFF),
     "visible characters and code points next to the ranges are not blank or invisible");

  // Malformed UTF-8.
  Ok(!Valid("cu\xC3st"), "a truncated UTF-8 sequence is refused");
  Ok(!Valid("\xC0\xAF"), "an overlong UTF-8 sequence is refused");
  Ok(!Valid("\xED\xA0\x80"), "an encoded surrogate is refused");
  Ok(!Valid("\xF4\x90\x80\x80"), "a code point above U+10FFFF is refused");

  // A database whose encoding is not UTF8 holds ASCII ids only.
  Ok(Valid("cust_1", CustomerIdCharset::kAsciiOnly), "ASCII is valid in ASCII-only mode");
  Ok(!Valid("cust_ü", CustomerIdCharset::kAsciiOnly) &&
         !Valid("cust_\xE9", CustomerIdCharset::kAsciiOnly),
     "any byte >= 0x80 is refused in ASCII-only mode");
  return tap::Done();
}

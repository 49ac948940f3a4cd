// The character rule of a customer id. Pure C++ (no PostgreSQL headers):
// the extension's CHECK on billguard.accounts and the unit tests use it.
//
// A customer id is a key of money: two ids that look alike on every screen
// ('cust_1' and 'cust_1' followed by U+00A0) would be two accounts, and one
// Stripe customer would be charged twice in a period. So an id must:
//   - be 1..kMaxCustomerIdBytes bytes of valid UTF-8 (ASCII only where the
//     database cannot hold Unicode, see CustomerIdCharset);
//   - hold no control character (Unicode Cc) anywhere;
//   - neither begin nor end with a character that is blank or invisible:
//     Unicode White_Space, a format character (Cf) or a Default_Ignorable
//     code point (fillers, variation selectors, tags).
// NFC normalization is the database's to check (PostgreSQL's is_normalized).
#pragma once

#include "cpp_only.hpp"

#include <string_view>

namespace billguard {

// What the text of a customer id may hold: any Unicode, or ASCII only (in a
// database whose encoding is not UTF8, where bytes >= 0x80 mean something
// else than the UTF-8 Stripe receives).
enum class CustomerIdCharset { kUnicode, kAsciiOnly };

// True for a code point that is White_Space, Cf or Default_Ignorable_Code_Point
// (Unicode 15): it shows as nothing, or as a blank, on a screen.
bool IsBlankOrInvisible(char32_t code_point);

// True when `customer_id` satisfies the rule above (NFC aside).
bool IsValidCustomerIdText(std::string_view customer_id, CustomerIdCharset charset);

}  // namespace billguard

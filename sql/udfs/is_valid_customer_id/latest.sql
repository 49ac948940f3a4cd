-- The one definition of a valid customer id, for the CHECK on
-- billguard.accounts (extension/customer_id.cpp): 1..255 bytes, NFC, no
-- control character, and neither first nor last character blank or
-- invisible (White_Space, format characters, default-ignorables), so that no
-- two accounts can look alike. In a database whose encoding is not UTF8 an
-- id is printable ASCII.
CREATE OR REPLACE FUNCTION billguard.is_valid_customer_id(customer_id text) RETURNS boolean
  LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
  AS 'MODULE_PATHNAME', 'billguard_is_valid_customer_id';
COMMENT ON FUNCTION billguard.is_valid_customer_id(text) IS
  'True for 1..255 bytes in NFC without control characters that neither begin nor end with white space or an invisible character.';

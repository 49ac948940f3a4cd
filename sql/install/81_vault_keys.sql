-- Vault keys: issuing one (joining its period's budget), reading its budget,
-- revoking it, and raising a budget's cap (the proxy's admin only).

\ir ../udfs/vault_key_caps/latest.sql
\ir ../udfs/vault_issue_key/latest.sql
\ir ../udfs/issue_vault_key/latest.sql
\ir ../udfs/vault_key_status/latest.sql
\ir ../udfs/revoke_vault_key/latest.sql
\ir ../udfs/raise_vault_cap/latest.sql

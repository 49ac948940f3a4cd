\ir ../udfs/is_valid_customer_id/latest.sql

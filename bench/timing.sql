-- bench_ms(sql): wall-clock milliseconds of one execution of sql, in the
-- server, so client round trips do not count.
CREATE FUNCTION public.bench_ms(sql text) RETURNS double precision
  LANGUAGE plpgsql AS $$
DECLARE
  started timestamptz := clock_timestamp();
BEGIN
  EXECUTE sql;
  RETURN extract(epoch FROM clock_timestamp() - started) * 1000;
END $$;

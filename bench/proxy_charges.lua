-- wrk script for bench/40_proxy.sh: POST /v1/payment_intents, each request
-- with its own Idempotency-Key (so every one is a new charge, authorized and
-- settled), with the key in BENCH_KEY.
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("thread_id", threads)
end

local counter = 0
local prefix
function init()
  prefix = os.getenv("BENCH_RUN") .. "-" .. thread_id .. "-"
end

local headers = {
  ["Authorization"] = "Bearer " .. os.getenv("BENCH_KEY"),
  ["Content-Type"] = "application/x-www-form-urlencoded",
}
local body = "amount=50&currency=usd&customer=cus_bench&payment_method=pm_card_visa&confirm=true&off_session=true"

function request()
  counter = counter + 1
  headers["Idempotency-Key"] = prefix .. counter
  return wrk.format("POST", "/v1/payment_intents", headers, body)
end

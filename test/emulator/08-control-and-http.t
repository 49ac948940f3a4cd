# The control API (reset, config, stats, ledger, loopback only) and the HTTP
# layer (keep-alive, Connection: close, pipelining, 100-continue, limits,
# unknown routes, concurrency).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use IO::Socket::INET;
use Test::More;
use Time::HiRes qw(sleep time);
use StripeEmulatorHarness;

my $emulator = StripeEmulatorHarness->start;
sub intent_params { StripeEmulatorHarness::payment_intent_params(@_) }

subtest 'stats' => sub {
  $emulator->post_form('/v1/payment_intents', intent_params(), idempotency_key => 'stats-1') for 1 .. 2;
  my $stats = $emulator->stats;
  for my $field (qw(requests created replayed rate_limited idempotency_conflicts in_use_conflicts
                    faults_applied max_concurrent)) {
    ok(exists $stats->{$field}, "has $field");
  }
  is($stats->{requests}, 2, 'requests');
  is($stats->{created}, 1, 'created');
  is($stats->{replayed}, 1, 'replayed');
  is($stats->{max_concurrent}, 1, 'max_concurrent');
};

subtest 'ledger is a JSON array in creation order' => sub {
  $emulator->post_form('/v1/charges', [amount => 900, currency => 'usd', customer => 'cus_c']);
  my $ledger = $emulator->ledger;
  is(ref $ledger, 'ARRAY', 'an array');
  is_deeply([map { $_->{object} } @$ledger], ['payment_intent', 'charge'], 'in creation order');
  is($ledger->[1]{idempotency_key}, undef, 'idempotency_key null without a key');
};

subtest 'reset forgets the ledger, keys, faults and stats' => sub {
  $emulator->add_fault(kind => 'status', status => 503, count => 5);
  my $response = $emulator->reset;
  is($response->{status}, 200, 'HTTP 200');
  is_deeply($emulator->ledger, [], 'ledger empty');
  is($emulator->stats->{requests}, 0, 'stats zeroed');
  my $after = $emulator->post_form('/v1/payment_intents', intent_params(), idempotency_key => 'stats-1');
  is($after->{status}, 200, 'faults gone');
  is($after->{headers}{'idempotent-replayed'}, 'false', 'keys gone: executed again');
};

subtest 'config' => sub {
  my $config = $emulator->control(GET => '/_emulator/config')->{json};
  is_deeply($config, {latency_ms => 0, rate_limit => 0, search_delay_ms => 0, idempotency_ttl => 86400,
    refused_accounts => []},
    'GET shows the start-up values');
  my $updated = $emulator->configure(latency_ms => 150, search_delay_ms => 10);
  is($updated->{status}, 200, 'POST: 200');
  is($updated->{json}{latency_ms}, 150, 'latency changed');
  is($updated->{json}{idempotency_ttl}, 86400, 'others unchanged');
  my $started = time;
  $emulator->get('/v1/payment_intents');
  cmp_ok(time - $started, '>=', 0.14, 'the new latency applies');
  $emulator->configure(latency_ms => 0);
  for my $bad ({latency_ms => -1}, {latency_ms => 'fast'}, {latency_ms => 1.5}, {latency => 5}) {
    is($emulator->control(POST => '/_emulator/config', $bad)->{status}, 400,
      'refused: ' . JSON::PP->new->canonical->encode($bad));
  }
  is($emulator->control(POST => '/_emulator/config', '[1]')->{status}, 400, 'not an object: 400');
  is($emulator->control(GET => '/_emulator/config')->{json}{latency_ms}, 0, 'a refused update changes nothing');
};

subtest 'unknown routes' => sub {
  my $unknown = $emulator->post_form('/v1/customers', [email => 'a@example.com']);
  is($unknown->{status}, 404, 'unknown /v1 path: 404');
  is($unknown->{json}{error}{type}, 'invalid_request_error', 'invalid_request_error');
  like($unknown->{json}{error}{message}, qr{^Unrecognized request URL \(POST: /v1/customers\)}, 'Stripe message');
  my $wrong_method = $emulator->request(DELETE => '/v1/payment_intents');
  is($wrong_method->{status}, 404, 'wrong method on a known path: Stripe-style 404');
  like($wrong_method->{json}{error}{message}, qr{\(DELETE: /v1/payment_intents\)}, 'names method and path');
  is($emulator->post_form('/v1/payment_intents/pi_x/confirm', [])->{status}, 404, 'unsupported sub-resource: 404');
  is($emulator->request(GET => '/')->{status}, 404, 'root: 404');
  is($emulator->control(GET => '/_emulator/nothing')->{status}, 404, 'unknown control path: 404');
  is($emulator->control(GET => '/_emulator/reset')->{status}, 404, 'control path with the wrong method: 404');
};

subtest 'keep-alive: several requests on one connection' => sub {
  my $socket = $emulator->connect_raw;
  for my $n (1 .. 3) {
    $emulator->send_raw_request($socket, GET => '/v1/payment_intents');
    my $response = StripeEmulatorHarness::read_response($socket, 5);
    is($response->{status}, 200, "request $n: 200");
    is($response->{headers}{connection}, 'keep-alive', "request $n: kept alive");
  }
};

subtest 'Connection: close is honoured' => sub {
  my $socket = $emulator->connect_raw;
  $emulator->send_raw_request($socket, GET => '/v1/payment_intents', headers => {Connection => 'close'});
  my $response = StripeEmulatorHarness::read_response($socket, 5);
  is($response->{status}, 200, 'answered');
  is($response->{headers}{connection}, 'close', 'says close');
  my $after = StripeEmulatorHarness::read_response($socket, 5);
  ok($after->{closed}, 'then closes the connection');
};

subtest 'HTTP/1.0 closes unless asked to keep alive' => sub {
  my $socket = $emulator->connect_raw;
  syswrite($socket, "GET /v1/payment_intents HTTP/1.0\r\nAuthorization: Bearer sk_test_x\r\n\r\n");
  my $response = StripeEmulatorHarness::read_response($socket, 5);
  is($response->{status}, 200, 'answered');
  ok(StripeEmulatorHarness::read_response($socket, 5)->{closed}, 'closed');
};

subtest 'pipelined requests are answered in order' => sub {
  my $socket = $emulator->connect_raw;
  my $body = StripeEmulatorHarness::form_encode(intent_params(amount => 4321));
  $emulator->send_raw_request($socket, POST => '/v1/payment_intents', body => $body);
  $emulator->send_raw_request($socket, GET => '/v1/charges/ch_missing');
  is(StripeEmulatorHarness::read_response($socket, 5)->{json}{amount}, 4321, 'first answer');
  is(StripeEmulatorHarness::read_response($socket, 5)->{status}, 404, 'second answer');
};

subtest 'Expect: 100-continue' => sub {
  my $socket = $emulator->connect_raw;
  my $body = StripeEmulatorHarness::form_encode(intent_params());
  syswrite($socket, "POST /v1/payment_intents HTTP/1.1\r\nAuthorization: Bearer sk_test_x\r\n"
    . "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: " . length($body)
    . "\r\nExpect: 100-continue\r\n\r\n");
  my $interim = StripeEmulatorHarness::read_response($socket, 5);
  is($interim->{status}, 100, '100 Continue before the body');
  syswrite($socket, $body);
  is(StripeEmulatorHarness::read_response($socket, 5)->{status}, 200, 'then the answer');
};

subtest 'bad requests' => sub {
  my %cases = (
    "NOT A REQUEST\r\n\r\n"                                            => 400,
    "GET /v1/payment_intents HTTP/2.0\r\n\r\n"                          => 505,
    "GET relative HTTP/1.1\r\n\r\n"                                     => 400,
    "POST /v1/charges HTTP/1.1\r\nContent-Length: abc\r\n\r\n"          => 400,
    "POST /v1/charges HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" => 411,
    "GET / HTTP/1.1\r\nBroken header\r\n\r\n"                           => 400,
  );
  for my $raw (sort keys %cases) {
    my $socket = $emulator->connect_raw;
    syswrite($socket, $raw);
    my $response = StripeEmulatorHarness::read_response($socket, 5);
    (my $label = $raw) =~ s/\r\n.*//s;
    is($response->{status}, $cases{$raw}, "\"$label\": $cases{$raw}");
    ok($response->{json}{error}, "\"$label\": Stripe-shaped error body");
  }
};

subtest 'bodies over 1 MiB: 413' => sub {
  my $socket = $emulator->connect_raw;
  my $size = 1024 * 1024 + 1;
  syswrite($socket, "POST /v1/payment_intents HTTP/1.1\r\nAuthorization: Bearer sk_test_x\r\n"
    . "Content-Length: $size\r\n\r\n");
  syswrite($socket, 'a' x 65536);
  my $response = StripeEmulatorHarness::read_response($socket, 5);
  is($response->{status}, 413, 'HTTP 413');
  my $fits = $emulator->post_form('/v1/payment_intents', intent_params('metadata[pad]' => 'x' x 400,
    description => 'd' x (1024 * 1000)));
  is($fits->{status}, 200, 'a body just under 1 MiB is fine');
};

subtest 'concurrent requests overlap (max_concurrent)' => sub {
  $emulator->reset;
  $emulator->configure(latency_ms => 300);
  my @sockets = map { $emulator->connect_raw } 1 .. 16;
  my $started = time;
  $emulator->send_raw_request($_, GET => '/v1/payment_intents') for @sockets;
  my @statuses = map { StripeEmulatorHarness::read_response($_, 10)->{status} } @sockets;
  my $elapsed = time - $started;
  $emulator->configure(latency_ms => 0);
  is_deeply(\@statuses, [(200) x 16], 'all answered');
  is($emulator->stats->{max_concurrent}, 16, 'all 16 were in progress at once');
  cmp_ok($elapsed, '<', 2.4, 'in parallel, not one after another (16 x 0.3 s)');
};

subtest 'the control API answers loopback clients only' => sub {
  my ($address) = grep { !/^127\./ } split ' ', (`hostname -I 2>/dev/null` // '');
  my $socket = $address && IO::Socket::INET->new(LocalAddr => $address, PeerAddr => '127.0.0.1',
    PeerPort => $emulator->port, Proto => 'tcp');
  plan skip_all => 'no non-loopback IPv4 address to connect from' unless $socket;
  syswrite($socket, "GET /_emulator/ledger HTTP/1.1\r\nHost: x\r\n\r\n");
  my $response = StripeEmulatorHarness::read_response($socket, 5);
  is($response->{status}, 403, "from $address: 403");
  like($response->{json}{error}{message}, qr/loopback/, 'explains');
  syswrite($socket, "GET /v1/payment_intents HTTP/1.1\r\nAuthorization: Bearer sk_test_x\r\n\r\n");
  is(StripeEmulatorHarness::read_response($socket, 5)->{status}, 200, 'the Stripe API still answers');
};

$emulator->stop;
done_testing;

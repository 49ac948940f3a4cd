# Injected faults: which are saved for the key, which create objects, and
# the two network failures (a hang, and an answer lost after the commit).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(sleep time);
use StripeEmulatorHarness;

my $emulator = StripeEmulatorHarness->start;
sub intent_params { StripeEmulatorHarness::payment_intent_params(@_) }
sub post_intent {
  my ($key, %overrides) = @_;
  return $emulator->post_form('/v1/payment_intents', intent_params(%overrides), idempotency_key => $key);
}
sub entries_for { my ($key) = @_; return grep { ($_->{idempotency_key} // '') eq $key } @{ $emulator->ledger } }

subtest 'queueing faults' => sub {
  my $queued = $emulator->add_fault(kind => 'status', status => 503, count => 2, path_prefix => '/v1/charges');
  is($queued->{status}, 200, 'POST /_emulator/faults: 200');
  is_deeply($queued->{json}, {queued => 2}, 'reports the total queued');
  is_deeply($emulator->add_fault(kind => 'hang', count => 1, path_prefix => '/v1/charges')->{json}, {queued => 3},
    'the total grows');
  my $listed = $emulator->control(GET => '/_emulator/faults')->{json};
  is($listed->{queued}, 3, 'GET /_emulator/faults lists them');
  is($listed->{faults}[0]{kind}, 'status', 'in order');
  $emulator->reset;
  is($emulator->control(GET => '/_emulator/faults')->{json}{queued}, 0, 'reset clears faults');

  for my $bad ({kind => 'explode'}, {kind => 'status'}, {kind => 'status', status => 200},
               {kind => 'hang', status => 500}, {kind => 'status', status => 503, create => JSON::PP::false},
               {kind => 'status', status => 503, executes => JSON::PP::false},
               {kind => 'status', status => 500, executes => JSON::PP::false, create => JSON::PP::false},
               {kind => 'hang', cuont => 1}, {kind => 'hang', count => -1}, {kind => 'hang', path_prefix => 'v1'},
               {kind => 'hang', method => 'DELETE'}) {
    my $response = $emulator->add_fault(%$bad);
    is($response->{status}, 400, 'refused: ' . JSON::PP->new->canonical->encode($bad));
  }
  is($emulator->control(POST => '/_emulator/faults', '{"kind":')->{status}, 400, 'malformed JSON: 400');
  is($emulator->control(GET => '/_emulator/faults')->{json}{queued}, 0, 'nothing was queued');
};

subtest '500: the object is created, the 500 is saved and replayed' => sub {
  $emulator->add_fault(kind => 'status', status => 500, count => 1);
  my $first = post_intent('fault-500');
  is($first->{status}, 500, 'HTTP 500');
  is($first->{json}{error}{type}, 'api_error', 'api_error');
  is($first->{json}{error}{message}, 'An unknown error occurred', 'message');
  my @entries = entries_for('fault-500');
  is(scalar @entries, 1, 'the object was created anyway');
  is($entries[0]{status}, 'succeeded', 'and it succeeded');
  my $retry = post_intent('fault-500');
  is($retry->{status}, 500, 'the retry gets the saved 500');
  is($retry->{headers}{'idempotent-replayed'}, 'true', 'Idempotent-Replayed: true');
  is($retry->{content}, $first->{content}, 'identical body');
  is(scalar(entries_for('fault-500')), 1, 'still one object');
  # Only a new key would charge again; reconciliation (search) finds the first one.
  my $found = $emulator->get('/v1/payment_intents', [customer => 'cus_harness', limit => 1]);
  is($found->{json}{data}[0]{id}, $entries[0]{id}, 'the list shows the object behind the 500');
};

subtest '500 with create:false creates nothing but is still saved' => sub {
  $emulator->add_fault(kind => 'status', status => 500, count => 1, create => JSON::PP::false);
  my $first = post_intent('fault-500-nothing');
  is($first->{status}, 500, 'HTTP 500');
  is(scalar(entries_for('fault-500-nothing')), 0, 'nothing created');
  my $retry = post_intent('fault-500-nothing');
  is($retry->{status}, 500, 'the retry gets the saved 500');
  is($retry->{headers}{'idempotent-replayed'}, 'true', 'replayed');
  is(scalar(entries_for('fault-500-nothing')), 0, 'still nothing created');
};

subtest '500 with executes:false: nothing created, nothing saved' => sub {
  $emulator->add_fault(kind => 'status', status => 500, count => 1, executes => JSON::PP::false);
  is($emulator->control(GET => '/_emulator/faults')->{json}{faults}[0]{executes}, JSON::PP::false,
    'listed with executes false');
  my $first = post_intent('fault-500-front');
  is($first->{status}, 500, 'HTTP 500');
  is($first->{json}{error}{type}, 'api_error', 'api_error');
  is(scalar(entries_for('fault-500-front')), 0, 'nothing created');
  my $retry = post_intent('fault-500-front');
  is($retry->{status}, 200, 'the retry with the same key executes');
  is($retry->{headers}{'idempotent-replayed'}, 'false', 'not a replay');
  is(scalar(entries_for('fault-500-front')), 1, 'exactly one object');
};

subtest '502/503/504 and others: nothing created, nothing saved' => sub {
  for my $status (502, 503, 504, 418) {
    my $key = "fault-$status";
    $emulator->add_fault(kind => 'status', status => $status, count => 1);
    my $first = post_intent($key);
    is($first->{status}, $status, "HTTP $status");
    is($first->{json}{error}{type}, 'api_error', "$status: api_error");
    is(scalar(entries_for($key)), 0, "$status: nothing created");
    my $retry = post_intent($key);
    is($retry->{status}, 200, "$status: the retry with the same key executes");
    is($retry->{headers}{'idempotent-replayed'}, 'false', "$status: not a replay");
    is(scalar(entries_for($key)), 1, "$status: exactly one object");
  }
};

subtest '429 fault: rate-limit answer on any method, nothing saved' => sub {
  $emulator->add_fault(kind => 'status', status => 429, count => 2);
  my $read = $emulator->get('/v1/payment_intents');
  is($read->{status}, 429, 'a GET gets it too');
  is($read->{json}{error}{type}, 'rate_limit_error', 'rate_limit_error');
  is($read->{json}{error}{code}, 'rate_limit', 'code rate_limit');
  is(post_intent('fault-429')->{status}, 429, 'POST: 429');
  my $retry = post_intent('fault-429');
  is($retry->{status}, 200, 'the retry executes');
  is($retry->{headers}{'idempotent-replayed'}, 'false', 'not a replay');
};

subtest 'faults are consumed in order by matching requests only' => sub {
  $emulator->add_fault(kind => 'status', status => 503, count => 1, path_prefix => '/v1/charges');
  $emulator->add_fault(kind => 'status', status => 502, count => 2);
  is($emulator->get('/v1/charges')->{status}, 200, 'GETs do not match POST faults');
  is(post_intent('order-1')->{status}, 502, 'a PaymentIntent skips the charges fault and takes the next');
  is($emulator->post_form('/v1/charges', [amount => 500, currency => 'usd', customer => 'cus_x'])->{status}, 503,
    'a Charge takes the charges fault');
  is(post_intent('order-2')->{status}, 502, 'the second 502');
  is(post_intent('order-3')->{status}, 200, 'then no more faults');
  $emulator->add_fault(kind => 'status', status => 503, count => 1, method => 'GET', path_prefix => '/v1/payment_intents/search');
  is($emulator->get('/v1/payment_intents/search', [query => "customer:'cus_x'"])->{status}, 503,
    'method GET with a path prefix hits search');
};

subtest 'commit_then_drop: created and saved, connection closed without a byte' => sub {
  my $applied_before = $emulator->stats->{faults_applied};
  $emulator->add_fault(kind => 'commit_then_drop', count => 1);
  my $socket = $emulator->connect_raw;
  $emulator->send_raw_request($socket, POST => '/v1/payment_intents',
    body => StripeEmulatorHarness::form_encode(intent_params()), idempotency_key => 'drop-1');
  my $answer = StripeEmulatorHarness::read_response($socket, 5);
  ok($answer->{closed}, 'the connection was closed');
  is($answer->{bytes}, '', 'without a single response byte');
  my @entries = entries_for('drop-1');
  is(scalar @entries, 1, 'the object was created');
  my $retry = post_intent('drop-1');
  is($retry->{status}, 200, 'the retry: 200');
  is($retry->{headers}{'idempotent-replayed'}, 'true', 'replayed');
  is($retry->{json}{id}, $entries[0]{id}, 'the object that was committed');
  is(scalar(entries_for('drop-1')), 1, 'still one object');
  is($emulator->stats->{faults_applied} - $applied_before, 1, 'stats count the fault');
};

subtest 'hang: no answer; the retry is not stuck behind the key and succeeds once' => sub {
  $emulator->add_fault(kind => 'hang', count => 1);
  my $socket = $emulator->connect_raw;
  $emulator->send_raw_request($socket, POST => '/v1/payment_intents',
    body => StripeEmulatorHarness::form_encode(intent_params()), idempotency_key => 'hang-1');
  my $answer = StripeEmulatorHarness::read_response($socket, 1);
  ok($answer->{timed_out}, 'no answer within the client timeout');
  is($answer->{bytes}, '', 'not a byte');
  is(scalar(entries_for('hang-1')), 0, 'nothing created');

  my $retry = post_intent('hang-1');    # the hung connection is still open
  is($retry->{status}, 200, 'the retry with the same key: 200, not 409');
  is($retry->{headers}{'idempotent-replayed'}, 'false', 'executed');
  my $again = post_intent('hang-1');
  is($again->{headers}{'idempotent-replayed'}, 'true', 'then replayed');
  is(scalar(entries_for('hang-1')), 1, 'exactly one object');

  my $late = StripeEmulatorHarness::read_response($socket, 0.5);
  ok($late->{timed_out} && $late->{bytes} eq '', 'the hung connection still has not answered');
  close $socket;
};

subtest 'HTTP::Tiny sees a hang as a timeout' => sub {
  $emulator->add_fault(kind => 'hang', count => 1);
  my $client = HTTP::Tiny->new(timeout => 1);
  my $started = time;
  my $response = $client->request(POST => $emulator->url('/v1/payment_intents'), {
    headers => {Authorization => "Bearer $StripeEmulatorHarness::DEFAULT_API_KEY",
                'Content-Type' => 'application/x-www-form-urlencoded', 'Idempotency-Key' => 'hang-2'},
    content => StripeEmulatorHarness::form_encode(intent_params()),
  });
  is($response->{status}, 599, 'client error (timeout)');
  cmp_ok(time - $started, '>=', 0.9, 'after the client timeout');
  is(post_intent('hang-2')->{status}, 200, 'the retry succeeds');
};

$emulator->stop;
done_testing;

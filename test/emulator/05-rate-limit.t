# The rate limiter: in front of authentication and idempotency, at most N
# requests admitted in any rolling second, 429s counted and never saved.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(sleep time);
use StripeEmulatorHarness;

my $emulator = StripeEmulatorHarness->start(args => ['--rate-limit', '5']);

subtest 'more than N requests in a second: 429' => sub {
  sleep 1.1;    # start from an empty window
  my $started = time;
  my @statuses = map { $emulator->get('/v1/payment_intents')->{status} } 1 .. 8;
  my $elapsed = time - $started;
  SKIP: {
    skip 'requests took longer than a second; the window moved', 3 if $elapsed >= 0.9;
    is_deeply([@statuses[0 .. 4]], [(200) x 5], 'the first five are admitted');
    is_deeply([@statuses[5 .. 7]], [(429) x 3], 'the rest are limited');
    is($emulator->stats->{rate_limited}, 3, 'stats count them');
  }
  my $limited = $emulator->get('/v1/payment_intents');
  is($limited->{json}{error}{type}, 'rate_limit_error', 'rate_limit_error');
  is($limited->{json}{error}{code}, 'rate_limit', 'code rate_limit');
  like($limited->{json}{error}{message}, qr/^Too many requests/, 'message');
};

subtest 'the limiter runs before authentication' => sub {
  my $response = $emulator->get('/v1/payment_intents', undef, api_key => undef);
  is($response->{status}, 429, 'no key, limited: 429 rather than 401');
};

subtest 'a 429 is not saved for the idempotency key' => sub {
  my $params = StripeEmulatorHarness::payment_intent_params();
  my $limited = $emulator->post_form('/v1/payment_intents', $params, idempotency_key => 'limited-1');
  is($limited->{status}, 429, 'limited: 429');
  sleep 1.1;
  my $retry = $emulator->post_form('/v1/payment_intents', $params, idempotency_key => 'limited-1');
  is($retry->{status}, 200, 'after the window: 200');
  is($retry->{headers}{'idempotent-replayed'}, 'false', 'executed, not replayed');
};

subtest 'the control API is not limited' => sub {
  is($emulator->control(GET => '/_emulator/stats')->{status}, 200, 'stats: 200') for 1 .. 10;
};

subtest 'the limit can change at run time' => sub {
  is($emulator->configure(rate_limit => 0)->{json}{rate_limit}, 0, 'turned off');
  my @statuses = map { $emulator->get('/v1/payment_intents')->{status} } 1 .. 20;
  is_deeply(\@statuses, [(200) x 20], 'no 429s when off');
  $emulator->configure(rate_limit => 2);
  @statuses = map { $emulator->get('/v1/payment_intents')->{status} } 1 .. 3;
  is($statuses[2], 429, 'a new limit of 2 applies at once');
};

$emulator->stop;
done_testing;

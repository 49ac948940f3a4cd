# Stripe Connect: a request with `Stripe-Account: acct_...` acts on that
# connected account. Objects and idempotency keys are kept per account (the
# platform is the account of requests without the header), reads see one
# account's objects only, application_fee_amount needs a connected account,
# and a connected account's webhooks carry its id in `account`, delivered
# to a Connect endpoint of their own when one is configured.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Digest::SHA ();
use JSON::PP;
use Test::More;
use StripeEmulatorHarness;

my $secret = 'whsec_emulatorConnect0123456789abc';
my ($listener, $hook_url) = StripeEmulatorHarness::webhook_listener();
my $emulator = StripeEmulatorHarness->start(args => [ '--webhook-url', $hook_url, '--webhook-secret', $secret ]);
# Nothing is delivered until the webhooks' own subtest.
$emulator->control(POST => '/_emulator/webhooks', { hold => JSON::PP::true });
sub intent_params { StripeEmulatorHarness::payment_intent_params(@_) }
sub on { my ($account) = @_; return defined $account ? (headers => { 'Stripe-Account' => $account }) : () }
sub post_intent {
  my ($account, $key, %overrides) = @_;
  return $emulator->post_form('/v1/payment_intents', intent_params(%overrides), idempotency_key => $key, on($account));
}
sub ledger_of_key { my ($key) = @_; return [grep { ($_->{idempotency_key} // '') eq $key } @{ $emulator->ledger }] }

subtest 'one Idempotency-Key on two accounts and the platform is three requests' => sub {
  my %made;
  for my $account (undef, 'acct_1TestAccountA0001', 'acct_1TestAccountB0002') {
    my $answer = post_intent($account, 'same-key-1', 'metadata[billguard_key]' => 'same-key-1');
    is($answer->{status}, 200, ($account // 'platform') . ': 200');
    is($answer->{headers}{'idempotent-replayed'}, 'false', '... not a replay');
    $made{$account // 'platform'} = $answer->{json}{id};
  }
  is(scalar(keys %{ { reverse %made } }), 3, 'three different PaymentIntents');
  my $entries = ledger_of_key('same-key-1');
  is_deeply([sort map { $_->{account} // 'platform' } @$entries],
    ['acct_1TestAccountA0001', 'acct_1TestAccountB0002', 'platform'],
    'the ledger shows three charges, each on its own account');
  my $again = post_intent('acct_1TestAccountA0001', 'same-key-1', 'metadata[billguard_key]' => 'same-key-1');
  is($again->{headers}{'idempotent-replayed'}, 'true', 'the key again on acct_A: a replay ...');
  is($again->{json}{id}, $made{acct_1TestAccountA0001}, '... of acct_A\'s own PaymentIntent');
  my $platform = post_intent(undef, 'same-key-1', 'metadata[billguard_key]' => 'same-key-1');
  is($platform->{json}{id}, $made{platform}, 'and on the platform, of the platform\'s');
  is(scalar @{ ledger_of_key('same-key-1') }, 3, 'still three charges');
  my $other = post_intent('acct_1TestAccountB0002', 'same-key-1', 'metadata[billguard_key]' => 'same-key-1', amount => 2500);
  is($other->{json}{error}{type}, 'idempotency_error',
    'other parameters under the key on acct_B: idempotency_error (acct_B\'s own first request)');
  my $fresh = post_intent('acct_1TestAccountC0003', 'same-key-1', 'metadata[billguard_key]' => 'same-key-1', amount => 2500);
  is($fresh->{status}, 200, 'while on a fourth account the same key with those parameters is a new request');
};

subtest 'reads see one account\'s objects only' => sub {
  $emulator->reset;
  my $on_a = post_intent('acct_1TestAccountA0001', 'reads-a', 'metadata[billguard_key]' => 'reads-1')->{json};
  my $on_platform = post_intent(undef, 'reads-p', 'metadata[billguard_key]' => 'reads-1')->{json};
  is($emulator->get("/v1/payment_intents/$on_a->{id}", undef, on('acct_1TestAccountA0001'))->{status}, 200,
    'retrieve on its account: 200');
  my $missing = $emulator->get("/v1/payment_intents/$on_a->{id}");
  is($missing->{status}, 404, 'retrieve of acct_A\'s object by the platform: 404');
  is($missing->{json}{error}{code}, 'resource_missing', '... resource_missing');
  is($emulator->get("/v1/payment_intents/$on_platform->{id}", undef, on('acct_1TestAccountA0001'))->{status}, 404,
    'retrieve of the platform\'s object on acct_A: 404');
  is($emulator->get("/v1/charges/$on_a->{latest_charge}", undef, on('acct_1TestAccountB0002'))->{status}, 404,
    'acct_A\'s charge on acct_B: 404');
  my $query = [query => "metadata['billguard_key']:'reads-1'"];
  my %found;
  for my $account (undef, 'acct_1TestAccountA0001', 'acct_1TestAccountB0002') {
    $found{$account // 'platform'} =
      [map { $_->{id} } @{ $emulator->get('/v1/payment_intents/search', $query, on($account))->{json}{data} }];
  }
  is_deeply($found{platform}, [$on_platform->{id}], 'search on the platform finds the platform\'s only');
  is_deeply($found{acct_1TestAccountA0001}, [$on_a->{id}], 'search on acct_A finds acct_A\'s only');
  is_deeply($found{acct_1TestAccountB0002}, [], 'search on acct_B finds nothing');
  my $list = $emulator->get('/v1/payment_intents', [customer => 'cus_harness'], on('acct_1TestAccountA0001'))->{json};
  is_deeply([map { $_->{id} } @{ $list->{data} }], [$on_a->{id}], 'list on acct_A: acct_A\'s only');
  my $cursor = $emulator->get('/v1/payment_intents', [starting_after => $on_platform->{id}], on('acct_1TestAccountA0001'));
  is($cursor->{status}, 400, 'a cursor of another account\'s object: 400');
};

subtest 'application_fee_amount' => sub {
  my $with_fee = post_intent('acct_1TestAccountA0001', 'fee-1', application_fee_amount => 150);
  is($with_fee->{status}, 200, 'on a connected account: 200');
  is($with_fee->{json}{application_fee_amount}, 150, 'the PaymentIntent carries it');
  my ($entry) = @{ ledger_of_key('fee-1') };
  is($entry->{application_fee_amount}, 150, '... and so does its ledger entry');
  is($entry->{account}, 'acct_1TestAccountA0001', '... with its account');
  is(post_intent(undef, 'fee-0')->{json}{application_fee_amount}, undef, 'none sent: null');
  my $charge = $emulator->post_form('/v1/charges',
    [amount => 1000, currency => 'usd', customer => 'cus_harness', application_fee_amount => 100],
    idempotency_key => 'fee-charge', on('acct_1TestAccountA0001'));
  is($charge->{json}{application_fee_amount}, 100, 'a Charge carries it too');
  my $platform = post_intent(undef, 'fee-2', application_fee_amount => 150);
  is($platform->{status}, 400, 'on the platform itself: 400');
  is($platform->{json}{error}{param}, 'application_fee_amount', '... on application_fee_amount');
  like($platform->{json}{error}{message}, qr/Stripe-Account header/, '... saying it needs a connected account');
  is(post_intent(undef, 'fee-2')->{status}, 200, '... and not saved for the key');
  is(post_intent('acct_1TestAccountA0001', 'fee-3', application_fee_amount => 2001)->{status}, 400,
    'more than the amount: 400');
  is(post_intent('acct_1TestAccountA0001', 'fee-4', application_fee_amount => '-1')->{json}{error}{code},
    'parameter_invalid_integer', 'a negative fee: parameter_invalid_integer');
};

subtest 'a Stripe-Account that names no account: 403, nothing created' => sub {
  my $created = $emulator->stats->{created};
  for my $bad ('acct_', 'cus_1TestAccountA0001', 'acct_1Test-Account', '', 'acct_1TestAccountA0001 ') {
    my $answer = $emulator->post_form('/v1/payment_intents', intent_params(), idempotency_key => 'bad-account',
      headers => { 'Stripe-Account' => $bad });
    my $shown = $bad =~ s/ +$//r;
    if ($bad ne $shown) {
      # Header values are trimmed on the way in, as every HTTP server does.
      is($answer->{status}, 200, "'$bad' is the trimmed '$shown'");
      next;
    }
    is($answer->{status}, 403, "'$bad': 403");
    like($answer->{json}{error}{message}, qr/does not have access to account '\Q$bad\E'/, '... naming it');
    unlike($answer->{content}, qr/\Q$StripeEmulatorHarness::DEFAULT_API_KEY\E/, '... never the whole key');
  }
  is($emulator->get('/v1/payment_intents', [], headers => { 'Stripe-Account' => 'nope' })->{status}, 403,
    'reads too');
  is($emulator->stats->{created}, $created + 1, 'only the well-shaped one created anything');

  my $set = $emulator->configure(refused_accounts => ['acct_1RevokedAccount01']);
  is_deeply($set->{json}{refused_accounts}, ['acct_1RevokedAccount01'], 'an account that refuses the platform, by config');
  my $refused = post_intent('acct_1RevokedAccount01', 'revoked-1');
  is($refused->{status}, 403, 'its requests: 403');
  like($refused->{json}{error}{message}, qr/does not have access to account 'acct_1RevokedAccount01' \(or that account does not exist\)/,
    '... Stripe\'s message');
  is(post_intent('acct_1TestAccountA0001', 'revoked-2')->{status}, 200, 'another account still answers');
  is($emulator->configure(refused_accounts => 'acct_1RevokedAccount01')->{status}, 400, 'not a list: 400');
  is($emulator->configure(refused_accounts => ['cus_1'])->{status}, 400, 'not acct_ ids: 400');
  $emulator->configure(refused_accounts => []);
  is(post_intent('acct_1RevokedAccount01', 'revoked-1')->{status}, 200, 'taken out of the list: it answers again');
};

subtest 'a connected account\'s webhooks name it in account; the platform\'s have none' => sub {
  $emulator->reset;
  $emulator->control(POST => '/_emulator/webhooks', { hold => JSON::PP::false });
  post_intent('acct_1TestAccountA0001', 'hooks-a', 'metadata[billguard_key]' => 'hooks-a');
  my @on_a = map { StripeEmulatorHarness::next_webhook_delivery($listener) } 1 .. 3;
  is_deeply([map { $_->{event}{account} } @on_a], [('acct_1TestAccountA0001') x 3],
    'created, succeeded and its charge: account acct_A');
  like($on_a[0]{body}, qr/^\{"id":"evt_\w+","object":"event","account":"acct_1TestAccountA0001",/,
    '... a top-level field beside id and object, as a Connect endpoint receives it');
  post_intent(undef, 'hooks-p', 'metadata[billguard_key]' => 'hooks-p');
  my @on_platform = map { StripeEmulatorHarness::next_webhook_delivery($listener) } 1 .. 3;
  ok(!grep({ exists $_->{event}{account} } @on_platform), 'the platform\'s events: no account field');
  my $refund = $emulator->control(POST => '/_emulator/refunds', { id => $on_a[1]{event}{data}{object}{id} });
  is($refund->{status}, 200, 'a refund of acct_A\'s charge (the dashboard sees every account)');
  is(StripeEmulatorHarness::next_webhook_delivery($listener)->{event}{account}, 'acct_1TestAccountA0001',
    '... announced with account acct_A');
};

subtest 'with a Connect endpoint: connected accounts\' events go there, signed with its secret' => sub {
  my ($connect_listener, $connect_url) = StripeEmulatorHarness::webhook_listener('/hooks/connect');
  my $connect_secret = 'whsec_emulatorConnectEndpoint0001';
  my $set = $emulator->control(POST => '/_emulator/webhooks', { connect_url => $connect_url, connect_secret => $connect_secret });
  is($set->{status}, 200, 'a Connect endpoint configured');
  is($set->{json}{connect_url}, $connect_url, '... shown');
  ok($set->{json}{connect_secret_set} && !exists $set->{json}{connect_secret}, '... its secret only as connect_secret_set');
  post_intent('acct_1TestAccountB0002', 'hooks-connect', 'metadata[billguard_key]' => 'hooks-connect');
  my @on_b = map { StripeEmulatorHarness::next_webhook_delivery($connect_listener) } 1 .. 3;
  is_deeply([map { $_ && $_->{event}{account} } @on_b], [('acct_1TestAccountB0002') x 3],
    'acct_B\'s three events reach the Connect endpoint');
  is($on_b[0]{path}, '/hooks/connect', '... at its path');
  my ($t, $v1) = ($on_b[0]{headers}{'stripe-signature'} // '') =~ /^t=(\d+),v1=([0-9a-f]{64})$/;
  is($v1, Digest::SHA::hmac_sha256_hex("$t.$on_b[0]{body}", $connect_secret), '... signed with the Connect endpoint\'s secret');
  post_intent(undef, 'hooks-account', 'metadata[billguard_key]' => 'hooks-account');
  my $platform = StripeEmulatorHarness::next_webhook_delivery($listener);
  ok($platform && !exists $platform->{event}{account}, 'the platform\'s events still reach the account endpoint');
  ($t, $v1) = ($platform->{headers}{'stripe-signature'} // '') =~ /^t=(\d+),v1=([0-9a-f]{64})$/;
  is($v1, Digest::SHA::hmac_sha256_hex("$t.$platform->{body}", $secret), '... signed with its own secret');
  StripeEmulatorHarness::next_webhook_delivery($listener) for 1 .. 2;
  my @endpoints = map { $_->{endpoint} } @{ $emulator->control(GET => '/_emulator/webhooks')->{json}{deliveries} };
  is(join(' ', @endpoints[-6 .. -1]), 'connect connect connect account account account', 'each delivery names its endpoint');
  is($emulator->control(POST => '/_emulator/webhooks', { connect_url => $connect_url, connect_secret => '' })->{status}, 400,
    'a Connect endpoint without a secret: 400');
};

$emulator->stop;
done_testing();

# Creating, declining, validating and reading PaymentIntents and Charges.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use StripeEmulatorHarness;

my $emulator = StripeEmulatorHarness->start;
sub intent_params { StripeEmulatorHarness::payment_intent_params(@_) }

subtest 'confirmed PaymentIntent succeeds and is in the ledger' => sub {
  my $response = $emulator->post_form('/v1/payment_intents',
    intent_params(amount => 1999, 'metadata[billguard_key]' => 'period-1', description => 'March'),
    idempotency_key => 'happy-1');
  is($response->{status}, 200, 'HTTP 200');
  is($response->{headers}{'content-type'}, 'application/json', 'JSON content type');
  like($response->{headers}{'request-id'}, qr/^req_\w+$/, 'Request-Id header');
  is($response->{headers}{'idempotent-replayed'}, 'false', 'first response: Idempotent-Replayed: false');
  my $intent = $response->{json};
  like($intent->{id}, qr/^pi_[A-Za-z0-9]{24}$/, 'pi_ id with 24 alphanumerics');
  is($intent->{object}, 'payment_intent', 'object');
  is($intent->{status}, 'succeeded', 'status succeeded');
  is($intent->{amount}, 1999, 'amount');
  is($intent->{currency}, 'usd', 'currency');
  is($intent->{customer}, 'cus_harness', 'customer');
  is($intent->{payment_method}, 'pm_card_visa', 'payment_method');
  is($intent->{description}, 'March', 'description');
  is_deeply($intent->{metadata}, {billguard_key => 'period-1'}, 'metadata');
  like($intent->{latest_charge}, qr/^ch_\w+$/, 'latest_charge set');
  ok(!$intent->{livemode}, 'livemode false');
  cmp_ok(abs($intent->{created} - time), '<', 60, 'created is now');

  my $ledger = $emulator->ledger;
  is(scalar @$ledger, 1, 'one ledger entry');
  is_deeply($ledger->[0], {
    id => $intent->{id}, object => 'payment_intent', account => undef, amount => 1999,
    application_fee_amount => undef, currency => 'usd', customer => 'cus_harness', status => 'succeeded', metadata => {billguard_key => 'period-1'},
    created => $intent->{created}, idempotency_key => 'happy-1',
    automatic_payment_methods => undef, payment_method_types => ['card'],
  }, 'ledger entry fields (how it may be paid: the default of API versions before 2023-08-16)');

  my $fetched = $emulator->get("/v1/payment_intents/$intent->{id}");
  is($fetched->{status}, 200, 'retrieve: 200');
  is($fetched->{content}, $response->{content}, 'retrieve returns the same object');
};

subtest 'how a PaymentIntent may be paid, and the API version' => sub {
  my $new_version = {headers => {'Stripe-Version' => '2024-06-20'}};
  my $bare = $emulator->post_form('/v1/payment_intents', intent_params(), %$new_version);
  is($bare->{status}, 400, 'Stripe-Version 2024-06-20, confirmed off session, no choice made: 400');
  is($bare->{json}{error}{type} . ' ' . $bare->{json}{error}{param}, 'invalid_request_error return_url',
    'an invalid_request_error about return_url');
  like($bare->{json}{error}{message}, qr/you must provide a `return_url`.*`automatic_payment_methods\[allow_redirects\]` to `never`/,
    'saying what to do');
  my $no_redirects = $emulator->post_form('/v1/payment_intents',
    intent_params('automatic_payment_methods[enabled]' => 'true', 'automatic_payment_methods[allow_redirects]' => 'never'),
    %$new_version, idempotency_key => 'apm-never');
  is($no_redirects->{status}, 200, 'automatic payment methods without redirects: 200');
  is_deeply($no_redirects->{json}{automatic_payment_methods}, {enabled => JSON::PP::true, allow_redirects => 'never'},
    'the PaymentIntent says so');
  my ($entry) = grep { ($_->{idempotency_key} // '') eq 'apm-never' } @{ $emulator->ledger };
  is_deeply([$entry->{automatic_payment_methods}, $entry->{payment_method_types}],
    [{enabled => JSON::PP::true, allow_redirects => 'never'}, []], 'and so does its ledger entry');
  my $cards = $emulator->post_form('/v1/payment_intents', intent_params('payment_method_types[]' => 'card'), %$new_version);
  is($cards->{status} . ' ' . join(',', @{ $cards->{json}{payment_method_types} // [] }), '200 card',
    'payment_method_types[]=card: 200');
  is($emulator->post_form('/v1/payment_intents', intent_params(return_url => 'https://example.com/back'), %$new_version)->{status},
    200, 'a return_url: 200');
  is($emulator->post_form('/v1/payment_intents', intent_params())->{status}, 200,
    'no Stripe-Version: the account\'s default (2020-08-27) takes cards, 200');
  is($emulator->post_form('/v1/payment_intents', intent_params(confirm => 'false'), %$new_version)->{status}, 200,
    'an unconfirmed PaymentIntent needs no return_url yet');
  my $account = StripeEmulatorHarness->start(args => ['--api-version', '2023-08-16']);
  is($account->post_form('/v1/payment_intents', intent_params())->{status}, 400,
    'an emulator started with --api-version 2023-08-16: no Stripe-Version, no choice made: 400');
  is($account->post_form('/v1/payment_intents', intent_params(), headers => {'Stripe-Version' => '2022-11-15'})->{status}, 200,
    'the request\'s Stripe-Version 2022-11-15 wins: 200');
  $account->stop;
  for my $bad ([['automatic_payment_methods[allow_redirects]' => 'never'], 'allow_redirects without enabled'],
               [['automatic_payment_methods[enabled]' => 'yes'], 'enabled not a boolean'],
               [['automatic_payment_methods[enabled]' => 'true', 'automatic_payment_methods[allow_redirects]' => 'sometimes'], 'allow_redirects neither always nor never'],
               [['automatic_payment_methods[enabled]' => 'true', 'payment_method_types[0]' => 'card'], 'both']) {
    is($emulator->post_form('/v1/payment_intents', intent_params(@{ $bad->[0] }))->{status}, 400, "refused: $bad->[1]");
  }
  is($emulator->post_form('/v1/charges', [amount => 500, currency => 'usd', customer => 'cus_harness',
    'automatic_payment_methods[enabled]' => 'true'])->{status}, 400, 'a Charge knows no automatic_payment_methods');
};

subtest 'unconfirmed PaymentIntent waits for confirmation' => sub {
  my $response = $emulator->post_form('/v1/payment_intents', intent_params(confirm => undef, off_session => undef));
  is($response->{status}, 200, 'HTTP 200');
  is($response->{json}{status}, 'requires_confirmation', 'status requires_confirmation');
  is($response->{json}{latest_charge}, undef, 'no charge');
  ok(!exists $response->{headers}{'idempotent-replayed'}, 'no Idempotent-Replayed without a key');
};

subtest 'declining test payment methods answer 402 with the PaymentIntent' => sub {
  for my $case (['pm_card_chargeDeclined', 'generic_decline'],
                ['pm_card_chargeDeclinedInsufficientFunds', 'insufficient_funds']) {
    my ($method, $decline_code) = @$case;
    my $response = $emulator->post_form('/v1/payment_intents', intent_params(payment_method => $method));
    is($response->{status}, 402, "$method: HTTP 402");
    my $error = $response->{json}{error};
    is($error->{type}, 'card_error', "$method: card_error");
    is($error->{code}, 'card_declined', "$method: card_declined");
    is($error->{decline_code}, $decline_code, "$method: decline_code $decline_code");
    like($error->{message}, qr/^Your card/, "$method: message");
    is($error->{payment_intent}{status}, 'requires_payment_method', "$method: embedded intent status");
    is($error->{payment_intent}{latest_charge}, undef, "$method: no charge");
    my ($entry) = grep { $_->{id} eq $error->{payment_intent}{id} } @{ $emulator->ledger };
    is($entry->{status}, 'requires_payment_method', "$method: declined intent is in the ledger");
  }
  my $generic = $emulator->post_form('/v1/payment_intents', intent_params(payment_method => 'pm_card_chargeDeclined'));
  is($generic->{json}{error}{message}, 'Your card was declined.', 'generic decline message');
};

subtest 'authentication-required card declines off session only' => sub {
  my $off = $emulator->post_form('/v1/payment_intents', intent_params(payment_method => 'pm_card_authenticationRequired'));
  is($off->{status}, 402, 'off session: 402');
  is($off->{json}{error}{code}, 'authentication_required', 'off session: authentication_required');
  my $on = $emulator->post_form('/v1/payment_intents',
    intent_params(payment_method => 'pm_card_authenticationRequired', off_session => 'false'));
  is($on->{status}, 200, 'on session: 200');
  is($on->{json}{status}, 'requires_action', 'on session: requires_action');
};

subtest 'parameter validation' => sub {
  my @cases = (
    [intent_params(amount => undef),              400, 'amount',   qr/Missing required param: amount/],
    [intent_params(amount => 'ten'),              400, 'amount',   qr/Invalid integer: ten/],
    [intent_params(amount => '-5'),               400, 'amount',   qr/Invalid integer/],
    [intent_params(amount => 49),                 400, 'amount',   qr/at least \$0\.50 usd/],
    [intent_params(amount => 100000000),          400, 'amount',   qr/no more than/],
    [intent_params(currency => undef),            400, 'currency', qr/Missing required param: currency/],
    [intent_params(currency => 'USD'),            400, 'currency', qr/Invalid currency/],
    [intent_params(currency => 'dollars'),        400, 'currency', qr/Invalid currency/],
    [intent_params(customer => undef),            400, 'customer', qr/Missing required param: customer/],
    [intent_params(customer => 'acct_1'),         400, 'customer', qr/No such customer: 'acct_1'/],
    [intent_params(payment_method => 'visa'),     400, 'payment_method', qr/No such PaymentMethod/],
    [intent_params(confirm => 'yes'),             400, 'confirm',  qr/Invalid boolean: yes/],
    [intent_params(capture => 'true'),            400, 'capture',  qr/Received unknown parameter: capture/],
    [intent_params('metadata[' . ('k' x 41) . ']' => 'v'), 400, 'metadata', qr/40 characters/],
    [intent_params('metadata[k]' => 'v' x 501),   400, 'metadata', qr/500 characters/],
    [[@{ intent_params() }, map { ("metadata[k$_]" => 'v') } 1 .. 51], 400, 'metadata', qr/50 keys/],
  );
  for my $case (@cases) {
    my ($params, $status, $param, $message) = @$case;
    my $response = $emulator->post_form('/v1/payment_intents', $params);
    is($response->{status}, $status, "$message: HTTP $status");
    is($response->{json}{error}{type}, 'invalid_request_error', "$message: invalid_request_error");
    is($response->{json}{error}{param}, $param, "$message: param $param");
    like($response->{json}{error}{message}, $message, "$message: message");
  }
  is($emulator->post_form('/v1/payment_intents', intent_params('metadata[k]' => 'v' x 500))->{status},
    200, 'metadata values of exactly 500 characters are fine');
  my $missing = $emulator->post_form('/v1/payment_intents', intent_params(customer => 'acct_1'));
  is($missing->{json}{error}{code}, 'resource_missing', 'customer without cus_: resource_missing');
  my $bad_escape = $emulator->request(POST => '/v1/payment_intents', 'amount=%zz');
  is($bad_escape->{status}, 400, 'malformed percent escape: 400');
};

subtest 'retrieve unknown objects' => sub {
  my $response = $emulator->get('/v1/payment_intents/pi_doesnotexist');
  is($response->{status}, 404, 'unknown PaymentIntent: 404');
  is($response->{json}{error}{code}, 'resource_missing', 'resource_missing');
  is($response->{json}{error}{type}, 'invalid_request_error', 'invalid_request_error');
  is($emulator->get('/v1/charges/ch_doesnotexist')->{status}, 404, 'unknown Charge: 404');
};

subtest 'charges' => sub {
  my $response = $emulator->post_form('/v1/charges',
    [amount => 500, currency => 'eur', customer => 'cus_charges', 'metadata[order]' => '42'],
    idempotency_key => 'charge-1');
  is($response->{status}, 200, 'HTTP 200');
  my $charge = $response->{json};
  like($charge->{id}, qr/^ch_[A-Za-z0-9]{24}$/, 'ch_ id');
  is($charge->{object}, 'charge', 'object');
  is($charge->{status}, 'succeeded', 'succeeded');
  ok($charge->{paid}, 'paid');
  is($charge->{amount}, 500, 'amount');
  is_deeply($charge->{metadata}, {order => '42'}, 'metadata');
  is($emulator->get("/v1/charges/$charge->{id}")->{content}, $response->{content}, 'retrieve');

  my $declined = $emulator->post_form('/v1/charges',
    [amount => 500, currency => 'usd', customer => 'cus_charges', source => 'tok_chargeDeclined']);
  is($declined->{status}, 402, 'tok_chargeDeclined: 402');
  is($declined->{json}{error}{type}, 'card_error', 'card_error');
  is($declined->{json}{error}{code}, 'card_declined', 'card_declined');
  like($declined->{json}{error}{charge}, qr/^ch_/, 'names the failed charge');
  is($emulator->get("/v1/charges/$declined->{json}{error}{charge}")->{json}{status}, 'failed',
    'the failed charge exists');

  my $neither = $emulator->post_form('/v1/charges', [amount => 500, currency => 'usd']);
  is($neither->{status}, 400, 'no customer and no source: 400');
  is($emulator->post_form('/v1/charges', [amount => 500, currency => 'usd', source => 'tok_visa'])->{status},
    200, 'source without customer is fine');
  is($emulator->post_form('/v1/charges', [amount => 500, currency => 'usd', customer => 'cus_x',
    payment_method => 'pm_card_visa'])->{status}, 400, 'payment_method is not a Charge parameter');
};

subtest 'JSON escaping of client-supplied text' => sub {
  my $tricky = qq{quote " backslash \\ newline \n tab \t control \x01 unicode \x{e9}};
  # www_form_urlencode sends characters as UTF-8.
  my $response = $emulator->post_form('/v1/payment_intents', intent_params('metadata[text]' => $tricky));
  is($response->{status}, 200, 'HTTP 200');
  ok($response->{json}, 'response is valid JSON');
  is($response->{json}{metadata}{text}, $tricky, 'text survives the round trip');
  my $invalid_utf8 = $emulator->request(POST => '/v1/payment_intents',
    StripeEmulatorHarness::form_encode(intent_params()) . '&metadata%5Btext%5D=a%FFb');
  is($invalid_utf8->{status}, 200, 'invalid UTF-8 in metadata: 200');
  is($invalid_utf8->{json}{metadata}{text}, "a\x{fffd}b", 'invalid UTF-8 is replaced, the JSON stays valid');
};

$emulator->stop;
done_testing;

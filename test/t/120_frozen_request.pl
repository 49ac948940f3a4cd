# billguard.stripe_endpoint changed while a record is unresolved: the record
# keeps the endpoint and the body of its first attempt, so the search and
# the re-send still go where the first charge went.
#
#   after a 500  the charge is created, its 500 cached; the endpoint is
#                switched to /v1/charges (reload) before the reconciliation:
#                the search still looks at /v1/payment_intents, finds it,
#                completed with its id
#   after a crash the charge is executing at the emulator when the server
#                crashes; it restarts with /v1/charges: the re-send goes to
#                /v1/payment_intents with the same body, Stripe replays it
# Both: exactly one charge for the key, no idempotency_error, nothing sent
# to /v1/charges.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;
use DispatchScenario;

my $emulator_log = "$PostgreSQL::Test::Utils::log_path/120_emulator.log";
my $emulator = StripeEmulatorHarness->start(quiet => 0, stderr => $emulator_log);
my $node = BillguardNode->dispatching('frozen_request', $emulator, "billguard.search_settle_delay = '1s'");
$node->add_accounts(4);
my @explain = (log_match => qr/billguard dispatcher|ERROR|FATAL/, log_heading => 'server log',
	emulator_log => $emulator_log);

# ---- after a 500: the endpoint changes before the reconciliation ----
{
	my ($c, $p) = ('cust_000001', '2031-01');
	my $key = $node->key_of($c, $p);
	my $failed = failures();
	$emulator->add_fault(kind => 'status', status => 500, count => 1);
	is($node->bill($c, $p), 'initiated', 'after a 500: billing initiated');
	ok(wait_until('the record unknown', 20, sub { $node->status_of($c, $p) eq 'unknown' }),
		'after a 500: the record is unknown (the 500 is cached at the emulator)');
	$node->reload_with(stripe_endpoint => '/v1/charges');
	ok(wait_until('the record settled', 30, sub { $node->status_of($c, $p) eq 'completed' }),
		'after a 500 and a switch to /v1/charges: the record is completed');
	my $ledger = ledger_for_key($emulator, $key);
	is(scalar(@$ledger), 1, 'after a 500: exactly one object for the key');
	is($ledger->[0]{object} // '', 'payment_intent', 'after a 500: a PaymentIntent, where the first attempt went');
	is($node->record_of($c, $p) =~ s/\|\d+$//r, "completed|" . ($ledger->[0]{id} // ''),
		"after a 500: completed with the emulator's id");
	is($node->event_types($c, $p), 'BillingInitiated,ChargeAttempted,ChargeUnknown,ChargeAttempted,ChargeReconciled',
		'after a 500: reconciled by the search');
	is($emulator->stats->{idempotency_conflicts}, 0, 'after a 500: no idempotency_error');
	explain_case($node, $emulator, $c, $p, $key, @explain) if failures() > $failed;
}

# ---- after a crash: the server restarts with the other endpoint ----
{
	my ($c, $p) = ('cust_000002', '2031-02');
	my $key = $node->key_of($c, $p);
	my $failed = failures();
	$node->reload_with(stripe_endpoint => undef);
	$emulator->configure(latency_ms => 1500);
	is($node->bill($c, $p), 'initiated', 'after a crash: billing initiated');
	ok(wait_until('the charge executing at the emulator', 20, sub { $emulator->stats->{in_progress} >= 1 }),
		'after a crash: the charge is executing at the emulator');
	$node->stop('immediate');
	ok(wait_until('the charge created', 20, sub { @{ succeeded_for_key($emulator, $key) } == 1 }),
		'after a crash: the emulator created the charge, no answer was recorded');
	my $original = succeeded_for_key($emulator, $key)->[0]{id} // '(none)';
	$emulator->configure(latency_ms => 0);
	$node->append_conf('postgresql.conf', "billguard.stripe_endpoint = '/v1/charges'");
	$node->start;
	ok(wait_until('the record settled', 30, sub { $node->status_of($c, $p) eq 'completed' }),
		'after a crash and a restart on /v1/charges: the record is completed');
	is(scalar(@{ ledger_for_key($emulator, $key) }), 1, 'after a crash: exactly one object for the key');
	is($node->q1("SELECT charge_id FROM billguard.billing_records WHERE idempotency_key = '$key'"), $original,
		'after a crash: completed with the charge created before the crash');
	is($node->q1(qq{SELECT string_agg(event ->> 'replayed', ',') FROM billguard.journal
		WHERE persistence_id = 'billing-$c-$p' AND event_type = 'BillingCompleted'}), 'true',
		'after a crash: the re-sent request was a replay of the first');
	is($emulator->stats->{idempotency_conflicts}, 0, 'after a crash: no idempotency_error');
	explain_case($node, $emulator, $c, $p, $key, @explain) if failures() > $failed;
}

# ---- nothing went to the new endpoint ----
my @requests = grep { m{ /v1/} } split /\n/, slurp_file($emulator_log);
is(scalar(grep { m{/v1/charges} } @requests), 0, 'no request went to /v1/charges')
  or diag(join("\n", @requests));
my $by_key = charges_by_key($emulator);
is(scalar(grep { @{ $by_key->{$_} } != 1 } keys %$by_key), 0, 'exactly one charge per key');
is($node->q1("SELECT count(*) FROM billguard.billing_records WHERE status = 'needs_review'"), '0', 'nothing needs review');

$node->stop;
$emulator->stop;
done_testing();

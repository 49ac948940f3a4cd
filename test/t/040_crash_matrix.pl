# Crash matrix: the dispatcher dies at every dangerous point of one charge,
# and after the restart the customer has been charged exactly once.
#
# Crash kinds:
#   A  kill -9 of the dispatcher (the postmaster crash-restarts the cluster)
#   B  the whole server: stop('immediate'), then start
# Crash points:
#   a  after the claim, before the send: the record is 'dispatching', the
#      request waits for its paced start, the emulator has not seen the key
#   b  after the emulator committed the charge, before any answer reached the
#      worker: commit_then_drop, and a test session holds the record's row
#      lock so the worker cannot record the transport error (it keeps it for
#      a later pass, never waiting for the row). libcurl re-sends
#      a request by itself (same key) when a reused keep-alive connection dies
#      without a byte; so a decoy first makes sure the connection is reused,
#      and two drops are queued: the original request and libcurl's re-send
#      on a fresh connection (a replay) both go unanswered.
#   c  after a normal successful answer arrived, before the database commit
#      of it: same row lock, no fault
#
# After each restart: exactly one succeeded charge at the emulator for the
# key, the record completed with exactly that id, and for b and c the
# completion is a replay of the original charge (BillingCompleted.replayed,
# the emulator's replay counter). At the end: no key anywhere got a second
# charge.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP;
use Time::HiRes qw(sleep time);
use BillguardTest;
use BillguardNode;
use DispatchScenario;

my $emulator_log = "$PostgreSQL::Test::Utils::log_path/040_emulator.log";
my $emulator = StripeEmulatorHarness->start(quiet => 0, stderr => $emulator_log);
my $node = BillguardNode->dispatching('crash_matrix', $emulator,
	"log_line_prefix = '%m [%p] %b '",
	"restart_after_crash = on");
$node->add_accounts(20);

# ---- helpers (shared ones: test/lib) ---------------------------------------

# What explain_case shows of the server log.
my @explain = (
	log_match => qr/billguard dispatcher|terminated|crash|recovery|ready to accept|ERROR|FATAL|PANIC/,
	log_heading => 'server log (billguard and crash lines, last 30)');

# Crashes the cluster in the way $kind says; returns the new dispatcher's pid.
sub crash {
	my ($kind) = @_;
	my $old = $node->dispatcher_pid;
	if ($kind eq 'A') {
		die "no dispatcher to kill" unless $old;
		kill('KILL', $old) or die "kill -9 $old: $!";
	} else {
		$node->stop('immediate');
		$node->start;
	}
	my $new = $node->wait_for_new_dispatcher($old, 60);
	note("crash $kind: dispatcher $old replaced by " . ($new || 'nothing'));
	return $new;
}

# The assertions every case shares. Returns true when all held.
sub assert_charged_once {
	my ($label, $customer, $period, $key, %expect) = @_;
	my $failed = failures();
	ok(wait_until("$customer/$period completed", 30,
		sub { $node->status_of($customer, $period) eq 'completed' }), "$label: record completed after the restart");
	my $succeeded = succeeded_for_key($emulator, $key);
	is(scalar(@$succeeded), 1, "$label: exactly one succeeded charge at the emulator for the key");
	is(scalar(@{ ledger_for_key($emulator, $key) }), 1, "$label: exactly one object of any status for the key");
	my $charge_id = @$succeeded ? $succeeded->[0]{id} : '(none)';
	is($node->q1("SELECT charge_id FROM billguard.billing_records WHERE customer_id = '$customer' AND billing_period = '$period'"),
		$charge_id, "$label: the record carries exactly that charge id");
	if (defined $expect{original_id}) {
		is($charge_id, $expect{original_id}, "$label: it is the charge created before the crash");
	}
	is($node->q1(qq{
		SELECT string_agg(event ->> 'charge_id' || '/' || (event ->> 'replayed'), ',')
		  FROM billguard.journal
		 WHERE persistence_id = 'billing-$customer-$period' AND event_type = 'BillingCompleted'}),
		"$charge_id/$expect{replayed}",
		"$label: one BillingCompleted with that id, replayed = $expect{replayed}");
	is($node->event_types($customer, $period, 'replayed'), $expect{events}, "$label: journal events");
	is($node->q1("SELECT attempts FROM billguard.billing_records WHERE customer_id = '$customer' AND billing_period = '$period'"),
		'2', "$label: two attempts: the interrupted one and the one after the restart");
	is($node->q1("SELECT billguard.entity_state('billing-$customer-$period') ->> 'charge_id'"), $charge_id,
		"$label: the folded entity state has the charge id");
	explain_case($node, $emulator, $customer, $period, $key, @explain) if failures() > $failed;
	return failures() == $failed;
}

# ---- point a: after the claim, before the send -------------------------------

sub case_a {
	my ($kind, $decoy, $customer, $period) = @_;
	my $label = "$kind-a (crash after claim, before send)";
	my $key = $node->key_of($customer, $period);

	# A rate of 0.1/s: after the decoy's request the next claimed row waits
	# ~10 s in the dispatcher's ready queue, claimed but not sent.
	$node->set_rate(0.1);
	is($node->bill($decoy, $period), 'initiated', "$label: decoy $decoy initiated");
	ok(wait_until("decoy $decoy completed", 20, sub { $node->status_of($decoy, $period) eq 'completed' }),
		"$label: the decoy is charged (it starts the 10 s pacing interval)");
	my $requests_before = $emulator->stats->{requests};

	is($node->bill($customer, $period), 'initiated', "$label: $customer initiated");
	my $claimed = wait_until("$customer claimed", 10, sub { $node->status_of($customer, $period) eq 'dispatching' });
	# Back to the fast rate for the next dispatcher; the running one keeps
	# its paced start time for the claimed row, so it stays unsent.
	$node->set_rate(undef);

	my $failed = failures();
	ok($claimed, "$label: the record is claimed ('dispatching')");
	is($node->q1(qq{SELECT count(*) FROM billguard.journal
		WHERE persistence_id = 'billing-$customer-$period' AND event_type = 'ChargeAttempted'}), '1',
		"$label: the claim journaled its ChargeAttempted");
	my $seen = scalar(@{ ledger_for_key($emulator, $key) });
	my $requests_at_crash = $emulator->stats->{requests};
	is($seen, 0, "$label: before the crash the emulator holds no object for the key");
	is($requests_at_crash, $requests_before, "$label: before the crash the emulator received no request at all since the decoy");
	is($node->status_of($customer, $period), 'dispatching', "$label: still dispatching right before the crash");
	explain_case($node, $emulator, $customer, $period, $key, @explain) if failures() > $failed;

	ok(crash($kind), "$label: a new dispatcher runs after the crash");
	assert_charged_once($label, $customer, $period, $key,
		replayed => 'false',
		events => 'BillingInitiated,ChargeAttempted,ChargeAttempted,BillingCompleted(false)');
	return;
}

# ---- points b and c: the charge exists, the worker is stuck before recording --

sub case_bc {
	my ($kind, $point, $customer, $period, $decoy) = @_;
	my $label = $point eq 'b'
	  ? "$kind-b (crash after Stripe committed, no answer reached the worker)"
	  : "$kind-c (crash after the answer arrived, before the database commit)";
	my $key = $node->key_of($customer, $period);

	if ($point eq 'b') {
		# A request just before leaves a keep-alive connection in the
		# dispatcher's cache, so the charge goes out on a reused connection.
		is($node->bill($decoy, $period), 'initiated', "$label: decoy $decoy initiated");
		ok(wait_until("decoy $decoy completed", 20, sub { $node->status_of($decoy, $period) eq 'completed' }),
			"$label: the decoy is charged (a warm connection)");
	}
	# The emulator sleeps 1 s before it executes a charge: time for the lock
	# session to lock the freshly claimed row before any answer comes back.
	$emulator->configure(latency_ms => 1000);
	my $before = $emulator->stats;
	if ($point eq 'b') {
		$emulator->add_fault(kind => 'commit_then_drop', count => 2);
	}
	my $lock = start_row_lock($node, $customer, $period);
	is($node->bill($customer, $period), 'initiated', "$label: $customer initiated");
	my $seen = row_lock_taken($lock);

	my $failed = failures();
	is($seen, 'dispatching:1', "$label: row lock taken while the first attempt is in flight");
	ok(wait_until('the charge at the emulator', 15, sub { scalar(@{ succeeded_for_key($emulator, $key) }) == 1 }),
		"$label: the emulator committed the charge");
	ok(wait_until('the answer waiting for the row lock', 15,
			sub { $node->answer_waits_for_row_lock($customer, $period) }),
		"$label: the answer arrived and waits for the row lock (the dispatcher itself never waits)");
	$emulator->configure(latency_ms => 0);
	my $at_crash = $emulator->stats;
	my $original = succeeded_for_key($emulator, $key);
	my $original_id = @$original ? $original->[0]{id} : '(none)';
	if ($point eq 'b') {
		is($at_crash->{faults_applied} - $before->{faults_applied}, 2,
			"$label: both drops took effect (the charge, and libcurl's own re-send)");
		is($emulator->control(GET => '/_emulator/faults')->{json}{queued}, 0,
			"$label: no fault left for the re-send after the restart");
	} else {
		is($at_crash->{replayed} - $before->{replayed}, 0, "$label: the first answer was not a replay");
	}
	note("$label: requests during the first attempt: " . ($at_crash->{requests} - $before->{requests})
		. ', replayed: ' . ($at_crash->{replayed} - $before->{replayed}));
	is($node->q1("SELECT status || ':' || attempts FROM billguard.billing_records WHERE customer_id = '$customer' AND billing_period = '$period'"),
		'dispatching:1', "$label: nothing recorded before the crash");
	explain_case($node, $emulator, $customer, $period, $key, @explain) if failures() > $failed;

	ok(crash($kind), "$label: a new dispatcher runs after the crash");
	end_row_lock($lock);

	assert_charged_once($label, $customer, $period, $key,
		original_id => $original_id,
		replayed => 'true',
		events => 'BillingInitiated,ChargeAttempted,ChargeAttempted,BillingCompleted(true)')
	  or diag("emulator stats at crash: " . JSON::PP->new->canonical->encode($at_crash));
	cmp_ok($emulator->stats->{replayed}, '>', $at_crash->{replayed},
		"$label: the emulator replayed the saved answer for the re-sent key");
	return;
}

# ---- the matrix ---------------------------------------------------------------

case_a('A', 'cust_000001', 'cust_000002', '2026-01');
case_a('B', 'cust_000003', 'cust_000004', '2026-02');
case_bc('A', 'b', 'cust_000005', '2026-03', 'cust_000009');
case_bc('B', 'b', 'cust_000006', '2026-04', 'cust_000010');
case_bc('A', 'c', 'cust_000007', '2026-05');
case_bc('B', 'c', 'cust_000008', '2026-06');

# ---- nobody was charged twice ------------------------------------------------

my $by_key = charges_by_key($emulator);
my @doubles = grep { @{ $by_key->{$_} } != 1 } sort keys %$by_key;
is(scalar(@doubles), 0, 'no key has more than one succeeded charge at the emulator')
  or diag('charged more than once: ' . join(', ', map { "$_ => [@{ $by_key->{$_} }]" } @doubles));
is(scalar(keys %$by_key), 10, 'ten keys charged: six crash cases and four decoys');
is(scalar(@{ $emulator->ledger }), 10, 'the emulator created ten objects in all');
is($node->q1(q{SELECT string_agg(status || '=' || n, ',') FROM
	(SELECT status, count(*) n FROM billguard.billing_records GROUP BY 1 ORDER BY 1) s}),
	'completed=10', 'all ten records completed');
my %record_charge = map { split /\|/ } split /\n/,
  $node->q1(q{SELECT idempotency_key || '|' || coalesce(charge_id, '') FROM billguard.billing_records});
is(join(',', grep { ($record_charge{$_} // '') ne ($by_key->{$_}[0] // '') } sort keys %$by_key), '',
	"every record carries its key's only charge id");
is($node->q1(q{SELECT count(*) FROM billguard.accounts a WHERE (SELECT count(*) FROM billguard.billing_records r
	WHERE r.customer_id = a.customer_id) > 1}), '0', 'no customer has more than one record');

$node->stop;
$emulator->stop;
done_testing();

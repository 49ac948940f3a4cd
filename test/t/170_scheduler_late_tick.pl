# The re-activated scheduler (failure mode 3): a database restored from a
# backup taken before a period's tick ticks again for that period, more than
# billguard.idempotency_window after it became due, when Stripe has pruned
# the keys of the charges made for it. Before, its records were new, so the
# dispatcher sent them as plain charges: every customer was charged twice.
#   - on time: the scheduler bills 2031-04 at 2031-05-01 00:00:05, plain
#     charges (ChargeAttempted(charge), no search), one per account;
#   - restored: pg_dump of the database taken before that tick, restored
#     into a second cluster served by the same emulator (same key namespace)
#     and adopted there as the billing database (the original is lost);
#     the emulator forgets every key; the restored scheduler ticks at
#     2031-05-03 00:00:05, two days late: its log line says it searches
#     first and why, every record searches, finds the original charge and
#     completes with it (ChargeReconciled), and the emulator still holds
#     exactly one charge per account.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);
use BillguardTest;
use BillguardNode;
use SchedulerScenario;

my $accounts = 10;
my $period = '2031-04';
my $emulator = start_emulator();
my $node = BillguardNode->dispatching('late_tick_original', $emulator);
$node->add_accounts($accounts);

# The backup, taken before the tick.
my $dump = $node->basedir . '/before_tick.dump';
my ($out, $err) = run_command([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('postgres') ]);
is($err, '', 'pg_dump before the tick reports nothing');

# ---- on time: plain charges ----------------------------------------------------------------

my $offset = set_scheduler($node, auto_bill => 'monthly', scheduler_now => '2031-05-01 00:00:05+00');
my $tick = wait_for_tick($node, $offset);
like($tick, qr/billed $period \(due 2031-05-01 00:00 UTC\): $accounts records claimed, 0 existed already; next bill at/,
	'on time: the scheduler bills 2031-04');
unlike($tick, qr/search/, 'on time: the tick searches nothing first');
billed_once($node, $emulator, 'on time', $period, $accounts);
is($node->q1(qq{SELECT string_agg(DISTINCT event ->> 'action', ',') FROM billguard.journal
	WHERE event_type = 'ChargeAttempted' AND persistence_id LIKE 'billing-%-$period'}), 'charge',
	'on time: every attempt was a plain charge');
my $original = $node->q1(qq{SELECT string_agg(customer_id || '=' || charge_id, ',' ORDER BY customer_id)
	FROM billguard.billing_records WHERE billing_period = '$period'});
is(scalar(@{ succeeded_charges($emulator) }), $accounts, "on time: the emulator holds $accounts charges");

# ---- Stripe forgets the keys; the backup is restored and ticks late -------------------------

$emulator->configure(idempotency_ttl => 1);
sleep 1.5;
my $restored = BillguardNode->dispatching('late_tick_restored', $emulator);
$restored->safe_psql('postgres', 'DROP EXTENSION billguard; DROP SCHEMA billguard');    # a fresh cluster
($out, $err) = run_command([ 'pg_restore', '-d', $restored->connstr('postgres'), $dump ]);
is($err, '', 'pg_restore of the backup reports no error');
is($restored->q1(q{SELECT count(*) FROM billguard.accounts}), $accounts, 'the restored database has the accounts');
is($restored->records_of($period), '0', "the restored database knows nothing of $period\'s billing");
is($restored->q1('SELECT billguard.key_namespace()'), $node->q1('SELECT billguard.key_namespace()'),
	'and the same key namespace');
like($restored->q1('SELECT billguard.adopt_database()'), qr/^adopted/, 'the restored database is adopted');

$offset = -s $restored->logfile;
$restored->append_conf('postgresql.conf',
	scheduler_conf(auto_bill => 'monthly', scheduler_now => '2031-05-03 00:00:05+00'));
$restored->restart;
$tick = wait_for_tick($restored, $offset);
like($tick,
	qr/billed $period \(due 2031-05-01 00:00 UTC\): $accounts records claimed, 0 existed already; each is searched for at Stripe before any charge is sent: the scheduler claimed $period 2 days 00:00:05 after it became due \(2031-05-01 00:00 UTC\), past billguard.idempotency_window \(23h\)/,
	'late: the tick logs that it searches first, and why');
ok($restored->wait_until_settled($period), "late: every record of $period settles");
is(scalar(@{ succeeded_charges($emulator) }), $accounts,
	"late: still exactly $accounts charges at the emulator, one per customer, not " . 2 * $accounts);
my ($wrong, $checked) = charged_once_each($restored, $emulator, $period);
is($wrong, '', 'late: every record is completed with the one charge the emulator holds for its key');
is($checked, $accounts, "late: $accounts records checked");
is($restored->q1(qq{SELECT string_agg(customer_id || '=' || charge_id, ',' ORDER BY customer_id)
	FROM billguard.billing_records WHERE billing_period = '$period'}), $original,
	'late: each record carries the original charge');
is($restored->event_types('cust_000001', $period, 'action'), 'BillingInitiated,ChargeAttempted(search),ChargeReconciled',
	'late: cust_000001 searched first and reconciled, sending no charge');
is($restored->q1(qq{SELECT count(*) FROM billguard.journal
	WHERE event_type = 'ChargeReconciled' AND persistence_id LIKE 'billing-%-$period'}), $accounts,
	'late: every record was reconciled');
is($restored->q1(qq{SELECT count(DISTINCT search_first_reason) || ' ' || count(search_first_reason)
	FROM billguard.billing_records WHERE billing_period = '$period'}), "1 $accounts",
	'late: every record carries the reason');

$restored->stop;
$node->stop;
$emulator->stop;
done_testing();

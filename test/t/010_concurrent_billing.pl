# Races at the SQL level: 8 sessions billing the same period of 10,000
# accounts at once, and 8 sessions hammering bill_customer for one customer.
# Afterwards: exactly one record and one BillingInitiated per (customer,
# period), and no error reached any caller.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;

my $node = BillguardNode->preloaded('concurrent');
$node->add_accounts(10_000);

# 8 x bill_period('2026-08'), released together.
my $gate = $node->start_gate;
my @racers = map {
	$node->race_psql("SELECT initiated, already_completed, in_progress, failed FROM billguard.bill_period('2026-08')")
} 1 .. 8;
$node->release_gate($gate, 8);
finish_race(@racers);

my $initiated_total = 0;
for my $i (0 .. $#racers) {
	my $r = $racers[$i];
	is($r->{exit}, 0, "bill_period session $i exited cleanly");
	is($r->{err}, '', "bill_period session $i saw no error");
	my ($initiated, $completed, $in_progress, $failed) = split /\|/, (split /\n/, $r->{out})[-1];
	$initiated_total += $initiated // 0;
	is(($initiated // 0) + ($in_progress // 0), 10_000,
		"session $i accounts for every account (initiated $initiated + in progress $in_progress)");
}
is($initiated_total, 10_000, 'the 8 sessions initiated 10,000 billings between them');
is($node->safe_psql('postgres',
	"SELECT count(*), count(DISTINCT idempotency_key) FROM billguard.billing_records WHERE billing_period = '2026-08'"),
	'10000|10000', 'one record and one key per customer');
is($node->safe_psql('postgres', q{
	SELECT count(*), count(DISTINCT persistence_id) FROM billguard.journal
	 WHERE event_type = 'BillingInitiated' AND event ->> 'billing_period' = '2026-08'}),
	'10000|10000', 'one BillingInitiated per customer');
is($node->safe_psql('postgres',
	"SELECT count(*) FROM billguard.journal WHERE persistence_id = 'billing-scheduler' AND event_type = 'BillingTickIssued'"),
	'1', 'one BillingTickIssued for the period');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM billguard.billing_records r
	  JOIN billguard.journal j ON j.persistence_id = 'billing-' || r.customer_id || '-' || r.billing_period
	 WHERE j.event ->> 'idempotency_key' <> r.idempotency_key}),
	'0', 'every event carries its record\'s key');

# 8 sessions x 100 calls of bill_customer for the same customer, each call its
# own transaction with its own request id.
$gate = $node->start_gate;
@racers = map {
	my $s = $_;
	$node->race_psql(join(";\n", map {
		"SELECT status || ' ' || idempotency_key FROM billguard.bill_customer('cust_000001', '2026-09', 'req-$s-$_')"
	} 1 .. 100));
} 1 .. 8;
$node->release_gate($gate, 8);
finish_race(@racers);

my %statuses;
my %keys;
for my $i (0 .. $#racers) {
	my $r = $racers[$i];
	is($r->{exit}, 0, "bill_customer session $i exited cleanly");
	is($r->{err}, '', "bill_customer session $i saw no error");
	for my $line (grep { length } split /\n/, $r->{out}) {
		my ($status, $key) = split / /, $line;
		$statuses{$status}++;
		$keys{$key}++;
	}
}
is($statuses{initiated}, 1, 'exactly one call initiated the billing');
is($statuses{in_progress}, 799, 'the other 799 calls answered in_progress');
is(scalar(keys %keys), 1, 'all 800 answers carry one key');
my $expected_key = $node->safe_psql('postgres', "SELECT billguard.idempotency_key('cust_000001', '2026-09')");
is((keys %keys)[0], $expected_key, 'that key is the content hash of customer and period');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM billguard.billing_records WHERE customer_id = 'cust_000001' AND billing_period = '2026-09'}),
	'1', 'one record');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM billguard.journal WHERE persistence_id = 'billing-cust_000001-2026-09'}),
	'1', 'one event');

$node->stop;
done_testing();

# The seed's failure mode 1 across a real crash: after an immediate shutdown
# and restart, billing the same customer and period again answers
# in_progress with the key stored before the crash, and creates nothing.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardNode;

my $node = BillguardNode->preloaded('restart');
$node->add_accounts(100);

my $first = $node->safe_psql('postgres',
	"SELECT status || ' ' || idempotency_key FROM billguard.bill_customer('cust_000001', '2026-08', 'before-crash')");
my ($status, $key) = split / /, $first;
is($status, 'initiated', 'first call initiates');
my $period = $node->safe_psql('postgres', "SELECT initiated FROM billguard.bill_period('2026-08')");
is($period, '99', 'bill_period initiates the other 99');

$node->stop('immediate');    # a crash: no shutdown checkpoint
$node->start;

my $again = $node->safe_psql('postgres',
	"SELECT status || ' ' || idempotency_key FROM billguard.bill_customer('cust_000001', '2026-08', 'after-crash')");
is($again, "in_progress $key", 'after the crash: in_progress with the same key');
is($node->safe_psql('postgres', "SELECT initiated || '/' || in_progress FROM billguard.bill_period('2026-08')"),
	'0/100', 'bill_period after the crash initiates nothing');

# Time moved on and the session is new; the key is still the content hash.
$node->safe_psql('postgres', "SELECT pg_sleep(1.1)");
is($node->safe_psql('postgres', "SELECT billguard.idempotency_key('cust_000001', '2026-08')"),
	$key, 'recomputing the key later gives the stored key');
is($node->safe_psql('postgres', q{
	SELECT count(*) || '/' || count(DISTINCT idempotency_key) FROM billguard.billing_records}),
	'100/100', 'one record per customer');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM billguard.journal WHERE event_type = 'BillingInitiated'}),
	'100', 'one BillingInitiated per customer');
is($node->safe_psql('postgres', q{
	SELECT request_id FROM billguard.billing_records WHERE customer_id = 'cust_000001'}),
	'before-crash', 'the tracing request id is the first caller\'s');

$node->stop;
done_testing();

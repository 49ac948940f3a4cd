# After a crash the statistics are reset and nothing re-analyzes: the plans
# of the dispatcher's hot-path statements must still find their row by the
# primary key. A backlog is claimed under statistics taken when every record
# was completed (no autovacuum), the server crashes, and auto_explain logs
# the plans the worker's statements (nested in the extension's functions)
# actually run with.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;

my $emulator = start_emulator();
my $node = BillguardNode->dispatching('plans', $emulator,
	"shared_preload_libraries = 'billguard,auto_explain'",
	'autovacuum = off',
	"log_line_prefix = '%m [%p] %b '",
	'auto_explain.log_nested_statements = on',
	'auto_explain.sample_rate = 0.05');
# A first period is billed and completed, and analyzed: the statistics say
# every record is completed and the queue's index is empty.
$node->add_accounts(4000);
is($node->q1("SELECT initiated FROM billguard.bill_period('2031-05')"), '4000', 'a first period billed');
ok($node->wait_until_settled('2031-05', 180), 'and completed');
$node->q1('VACUUM ANALYZE billguard.billing_records');
# Then a backlog of 4,000 is claimed while the dispatcher is paused.
my $key_file = $node->q1('SHOW billguard.api_key_file');
$node->reload_with(api_key_file => '');
is($node->q1("SELECT initiated FROM billguard.bill_period('2031-06')"), '4000', 'a backlog of 4,000 records claimed');
$node->stop('immediate');
$node->append_conf('postgresql.conf', 'auto_explain.log_min_duration = 0');
$node->start;
$node->reload_with(api_key_file => $key_file);
is($node->q1("SELECT coalesce(n_mod_since_analyze, 0) FROM pg_stat_user_tables WHERE relid = 'billguard.billing_records'::regclass"),
	'0', 'after the crash the statistics know of no change since the (empty) ANALYZE');
ok($node->wait_until_settled('2031-06', 180), 'the backlog drains');

# Plans logged by the dispatcher for statements that look a record up by key.
my @plans = grep { /Query Text:.*idempotency_key = (?:\w+\.)?key/s }
  split /(?=^\S+ \S+ \S+ \[\d+\] billguard dispatcher LOG:  duration:)/m, slurp_file($node->logfile);
@plans = grep { /billguard dispatcher LOG:  duration:/ } @plans;
cmp_ok(scalar(@plans), '>', 20, 'auto_explain logged the plans of the worker\'s statements (' . scalar(@plans) . ')');
my @off_key = grep { !/using billing_records_pk/ || /Seq Scan|billing_records_due/ } @plans;
is(scalar(@off_key), 0, 'every hot-path statement that looks a record up by key uses the primary key')
  or diag("first plan that does not:\n" . $off_key[0]);
is(scalar(@{ charges_by_key($emulator)->{ $node->key_of('cust_000001', '2031-06') } // [] }), 1,
	'(the records were charged, once each)');

$node->stop;
$emulator->stop;
done_testing();

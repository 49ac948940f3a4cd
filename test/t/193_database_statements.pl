# Statements on a whole database, on a server that serves every database
# with the extension:
#   - DROP DATABASE of a database that bills a history not archived is
#     refused with the archive hint, also WITH (FORCE) and once connections
#     are disallowed (before: dropped with its history), and nothing is
#     stopped for it;
#   - ALTER DATABASE ... RENAME TO, SET TABLESPACE and CREATE DATABASE ...
#     TEMPLATE of a served database run at once, as on a plain server: its
#     dispatcher is stopped for them and is back afterwards (before: each
#     failed after 5 s, the dispatcher being connected);
#   - its history archived, DROP DATABASE drops it at once; so does its
#     owner, who is no superuser, a database with the extension and no
#     history, and anyone a copy that was never adopted;
#   - a role that may not run one of them (not the owner) gets PostgreSQL's
#     refusal, and the dispatcher is left running.
use strict;
use warnings;
use File::Path qw(make_path);
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use BillguardTest;
use BillguardNode;

my $emulator = start_emulator();
my $node = BillguardNode->dispatching('database_statements', $emulator, "billguard.database = ''");
$node->q1('DROP EXTENSION billguard');    # billing is the one database that bills

sub qd { my ($database, $sql) = @_; return $node->safe_psql($database, $sql) }
sub dispatcher_of {
	my ($database) = @_;
	return $node->q1(qq{SELECT coalesce(max(pid), 0) FROM pg_stat_activity
		WHERE backend_type = 'billguard dispatcher' AND datname = '$database'});
}
sub served {
	my ($database) = @_;
	return wait_until("a dispatcher in $database", 30, sub { dispatcher_of($database) });
}
# Runs $sql as $user in database postgres: (exit code, stderr, seconds).
sub timed {
	my ($sql, $user) = @_;
	my $start = time;
	my ($rc, $out, $err) = $node->psql('postgres', $sql, extra_params => [ '-U', $user // 'postgres' ]);
	return ($rc, $err, time - $start);
}

$node->q1('CREATE ROLE billing_owner LOGIN CREATEDB; CREATE ROLE stranger LOGIN CREATEDB');
$node->q1('CREATE DATABASE billing OWNER billing_owner');
qd('billing', 'CREATE EXTENSION billguard');
qd('billing', q{INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
	SELECT 'cust_' || g, 'cus_' || g, 1000 + g, 'usd', 'pm_card_visa' FROM generate_series(1, 10) g});
is(qd('billing', "SELECT initiated FROM billguard.bill_period('2031-01')"), '10', 'billing: 10 records');
ok(wait_until('billing settled', 30, sub {
	qd('billing', q{SELECT count(*) FROM billguard.billing_records WHERE status <> 'completed'}) eq '0' }),
	'billing: charged');
ok(served('billing'), 'billing is served');
my $pid = dispatcher_of('billing');

# ---- DROP DATABASE of a billed history ----------------------------------------------

for my $drop ('DROP DATABASE billing', 'DROP DATABASE billing WITH (FORCE)') {
	my ($rc, $err) = timed($drop);
	like($err, qr/ERROR:  DROP DATABASE would drop billguard's billing history \(10 billing records\)/, "$drop is refused");
	like($err, qr/HINT:  Archive the history first: in database "billing", SELECT \* FROM billguard\.archive_history\('billguard_archive'\); then run DROP DATABASE again\./,
		'with the hint to archive first');
}
$node->q1('ALTER DATABASE billing ALLOW_CONNECTIONS false');
my ($rc, $err) = timed('DROP DATABASE billing', 'billing_owner');
like($err, qr/DROP DATABASE would drop billguard's billing history/,
	'the owner\'s DROP DATABASE, connections disallowed, is refused too');
$node->q1('ALTER DATABASE billing ALLOW_CONNECTIONS true');
is($node->q1(q{SELECT count(*) FROM pg_database WHERE datname = 'billing'}), '1', 'billing is still there');
ok(served('billing'), 'and served again');
$pid = dispatcher_of('billing');

# ---- others may not --------------------------------------------------------------------

for my $statement ('DROP DATABASE billing', 'ALTER DATABASE billing RENAME TO stolen',
	'CREATE DATABASE stolen TEMPLATE billing') {
	($rc, $err) = timed($statement, 'stranger');
	like($err, qr/ERROR:  (must be owner of database billing|permission denied to copy database "billing")/,
		"a stranger's $statement: PostgreSQL's refusal");
}
is(dispatcher_of('billing'), $pid, 'and the dispatcher runs on');

# ---- RENAME, SET TABLESPACE, TEMPLATE ---------------------------------------------------

my $seconds;
($rc, $err, $seconds) = timed('ALTER DATABASE billing RENAME TO renamed');
is($rc, 0, 'ALTER DATABASE ... RENAME TO of the served database succeeds') or diag($err);
cmp_ok($seconds, '<', 4, sprintf('at once (%.1f s)', $seconds));
ok(served('renamed'), 'a dispatcher serves it again under its new name');
my $location = $node->basedir . '/moved';
make_path($location);
$node->q1("CREATE TABLESPACE moved LOCATION '$location'");
($rc, $err, $seconds) = timed('ALTER DATABASE renamed SET TABLESPACE moved');
is($rc, 0, 'ALTER DATABASE ... SET TABLESPACE of the served database succeeds') or diag($err);
cmp_ok($seconds, '<', 4, sprintf('at once (%.1f s)', $seconds));
ok(served('renamed'), 'and it is served again');
($rc, $err, $seconds) = timed('CREATE DATABASE copy TEMPLATE renamed');
is($rc, 0, 'CREATE DATABASE ... TEMPLATE of the served database succeeds') or diag($err);
cmp_ok($seconds, '<', 4, sprintf('at once (%.1f s)', $seconds));
ok(served('renamed'), 'and it is served again');
is(qd('renamed', 'SELECT count(*) FROM billguard.billing_records'), '10', 'renamed keeps its 10 records');

# ---- DROP DATABASE that loses nothing -------------------------------------------------

($rc, $err, $seconds) = timed('DROP DATABASE copy', 'postgres');
is($rc, 0, 'DROP DATABASE of a copy never adopted: it bills nothing, and loses nothing') or diag($err);
qd('renamed', 'UPDATE billguard.accounts SET active = false');
is(qd('renamed', q{SELECT count(*) FROM billguard.billing_records WHERE status = 'completed'}), '10', 'every record settled');
qd('renamed', q{SELECT * FROM billguard.archive_history('billguard_archive')});
ok(served('renamed'), 'its history archived, renamed is still served');
($rc, $err, $seconds) = timed('DROP DATABASE renamed', 'billing_owner');
is($rc, 0, 'its owner, no superuser, drops it while its dispatcher runs') or diag($err);
cmp_ok($seconds, '<', 4, sprintf('at once (%.1f s)', $seconds));

$node->q1('CREATE DATABASE unused OWNER billing_owner');
qd('unused', 'CREATE EXTENSION billguard');
ok(served('unused'), 'a database with the extension and no history is served');
($rc, $err, $seconds) = timed('DROP DATABASE unused', 'billing_owner');
is($rc, 0, 'its owner drops it') or diag($err);
cmp_ok($seconds, '<', 4, sprintf('at once (%.1f s)', $seconds));
$node->q1('CREATE DATABASE plain OWNER billing_owner');
($rc, $err) = timed('DROP DATABASE plain', 'billing_owner');
is($rc, 0, 'a database without the extension drops as on a plain server') or diag($err);
is($node->q1(q{SELECT string_agg(datname, ',' ORDER BY datname) FROM pg_database WHERE datname NOT LIKE 'template%'}),
	'postgres', 'only postgres is left');

$node->stop;
$emulator->stop;
done_testing();

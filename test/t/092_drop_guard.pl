# DROP cannot take the billing history with it, in a cluster that preloads
# billguard and in one that does not, each DROP in a session of its own (in
# the second cluster one that never loaded billguard.so before the DROP):
#   - DROP EXTENSION billguard, with CASCADE, DROP SCHEMA billguard CASCADE
#     and DROP OWNED BY the extension's owner are refused with 2BP01 and a
#     hint to archive, and every record is still there;
#   - so is a statement that names something else and would drop billguard
#     by its cascade: DROP EXTENSION plpgsql CASCADE (before, it dropped
#     billguard and its 20 records);
#   - and every one of them with session_replication_role = replica, which
#     turned the guard off before; DROP ROLE of the owner PostgreSQL refuses
#     by itself;
#   - pg_restore --clean into the database refuses to drop it too, and a
#     billguard without records drops as before;
#   - the way out: archive_history() refuses while records may still be
#     sent, then moves the history into an archive schema, read-only, after
#     which DROP EXTENSION billguard succeeds and every row is in the archive.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardNode;

# Runs $sql in a new session; returns (exit code, stdout, stderr).
sub session {
	my ($node, $sql, %options) = @_;
	my ($rc, $out, $err) = $node->psql($options{database} // 'postgres', $sql,
		extra_params => [ '-v', 'ON_ERROR_STOP=1', @{ $options{extra} // [] } ]);
	return ($rc, $out, $err);
}

sub records { my ($node) = @_; return $node->safe_psql('postgres', 'SELECT count(*) FROM billguard.billing_records') }

my $preloaded = BillguardNode->preloaded('drop_preloaded');
my $plain = BillguardNode->new('drop_plain');
$plain->init;
$plain->start;
# Created by a superuser other than the bootstrap one, whose objects DROP OWNED can drop.
$plain->safe_psql('postgres', 'CREATE ROLE billing_admin SUPERUSER LOGIN');
$plain->safe_psql('postgres', 'CREATE EXTENSION billguard', extra_params => [ '-U', 'billing_admin' ]);
# The same owner in the preloaded cluster: the bootstrap superuser owns
# what DROP OWNED refuses to drop by itself.
$preloaded->safe_psql('postgres', 'CREATE ROLE billing_admin SUPERUSER LOGIN');
$preloaded->safe_psql('postgres', 'DROP EXTENSION billguard');
$preloaded->safe_psql('postgres', 'CREATE EXTENSION billguard', extra_params => [ '-U', 'billing_admin' ]);

for my $node ($preloaded, $plain) {
	my $name = $node->name;
	$node->add_accounts(20);
	$node->safe_psql('postgres', "SELECT * FROM billguard.bill_period('2026-08')");
	is(records($node), '20', "$name: 20 billing records");
	my $loaded = $node eq $plain ? 'not loaded' : 'akka-billing';
	for my $replica ('', 'SET session_replication_role = replica;') {
		for my $drop ('DROP EXTENSION billguard', 'DROP EXTENSION billguard CASCADE', 'DROP SCHEMA billguard CASCADE',
			'DROP OWNED BY billing_admin CASCADE', 'DROP EXTENSION plpgsql CASCADE') {
			my ($command) = $drop =~ /^(DROP \w+)/;
			my $how = $replica ? "$drop, in replica mode," : $drop;
			my ($rc, $out, $err) = session($node,
				"SELECT coalesce(current_setting('billguard.key_namespace', true), 'not loaded');\n$replica\n$drop;");
			is($out, $loaded, "$name: the session of '$how' had billguard.so " . ($node eq $plain ? 'not loaded' : 'preloaded'));
			like($err, qr/ERROR:  $command would drop billguard's billing history \(20 billing records\)/,
				"$name: $how is refused");
			like($err, qr/HINT:  Archive the history first: SELECT \* FROM billguard\.archive_history/,
				"$name: and told to archive first");
			is(records($node), '20', "$name: after $how every record is still there");
		}
	}
	is($node->safe_psql('postgres', q{SELECT string_agg(extname, ',' ORDER BY extname) FROM pg_extension
		WHERE extname IN ('billguard', 'plpgsql')}), 'billguard,plpgsql', "$name: billguard and plpgsql are still there");
	# DROP ROLE never cascades: PostgreSQL refuses the owner's.
	my ($rc, $out, $err) = session($node, 'DROP ROLE billing_admin');
	like($err, qr/ERROR:  role "billing_admin" cannot be dropped because some objects depend on it/,
		"$name: DROP ROLE of the extension's owner is refused");
	is(records($node), '20', "$name: after DROP ROLE every record is still there");
}

# pg_restore --clean drops and re-creates what it restores: not billguard's history.
my $dump = $preloaded->basedir . '/billing.dump';
my ($out, $err) = run_command([ 'pg_dump', '-Fc', '-f', $dump, '-d', $preloaded->connstr('postgres') ]);
($out, $err) = run_command([ 'pg_restore', '--clean', '--if-exists', '-d', $preloaded->connstr('postgres'), $dump ]);
like($err, qr/DROP EXTENSION would drop billguard's billing history/, 'pg_restore --clean is refused the DROP EXTENSION');
is(records($preloaded), '20', 'and every record is still there');
is($preloaded->safe_psql('postgres', "SELECT count(DISTINCT idempotency_key) FROM billguard.billing_records"), '20',
	'once');

# A billguard without billing records drops as before.
$preloaded->safe_psql('postgres', 'CREATE DATABASE unused');
$preloaded->safe_psql('unused', 'CREATE EXTENSION billguard');
my ($rc) = session($preloaded, 'DROP EXTENSION billguard', database => 'unused');
is($rc, 0, 'DROP EXTENSION billguard without billing records succeeds');

# Retiring billguard, keeping the history.
($rc, $out, $err) = session($plain, "SELECT * FROM billguard.archive_history('billguard_archive')");
like($err, qr/ERROR:  20 billing records may still be sent to Stripe/, 'archive_history refuses while records may still be sent');
$plain->safe_psql('postgres', 'UPDATE billguard.accounts SET active = false');
is($plain->safe_psql('postgres', q{SELECT count(*) FROM billguard.billing_records WHERE status = 'cancelled'}), '20',
	'deactivating every account cancelled the never-sent records');
my $before = $plain->safe_psql('postgres', q{
	SELECT string_agg(t::text, E'\n' ORDER BY t::text) FROM billguard.billing_records t});
my $journal_before = $plain->safe_psql('postgres', 'SELECT count(*) FROM billguard.journal');
($rc, $out, $err) = session($plain, "SELECT * FROM billguard.archive_history('billguard_archive')");
is($rc, 0, 'archive_history succeeds once nothing may be sent') or diag($err);
like($out, qr/^billguard_archive\.billing_records\|20$/m, 'it reports the 20 archived billing records');
($rc, $out, $err) = session($plain, "SELECT coalesce(current_setting('billguard.key_namespace', true), 'not loaded');\n"
	. 'DROP EXTENSION billguard;');
is($rc, 0, 'DROP EXTENSION billguard then succeeds, in a session that never loaded billguard.so') or diag($err);
is($plain->safe_psql('postgres', "SELECT count(*) FROM pg_extension WHERE extname = 'billguard'"), '0', 'billguard is gone');
is($plain->safe_psql('postgres', q{
	SELECT string_agg(t::text, E'\n' ORDER BY t::text) FROM billguard_archive.billing_records t}), $before,
	'every billing record is in the archive, unchanged');
is($plain->safe_psql('postgres', 'SELECT count(*) FROM billguard_archive.journal'), $journal_before,
	'and every journal event');
is($plain->safe_psql('postgres', 'SELECT count(*) FROM billguard_archive.accounts'), '20', 'and the accounts');
($rc, $out, $err) = session($plain, 'DELETE FROM billguard_archive.journal');
like($err, qr/billguard_archive\.journal is archived billing history: DELETE refused/, 'the archive is read-only');
($rc, $out, $err) = session($plain, 'CREATE EXTENSION billguard');
is($rc, 0, 'billguard can be installed again beside the archive') or diag($err);

$preloaded->stop;
$plain->stop;
done_testing();

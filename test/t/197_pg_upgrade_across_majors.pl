# PostgreSQL upgraded to its next major under a billing database loses no
# bill and charges none twice: pg_upgrade in --link and in --copy mode, and
# pg_dump into the new major with pg_restore. Runs where the major before
# this one is installed beside it with billguard built for it (the chroots
# of test/majors: 15 -> 17 in trixie's, 17 -> 18 in forky's); skipped, saying
# so, where it is not (this machine's 15).
#
# Each way starts from a cluster of the old major whose database holds
#   - history: 2031-01 settled at the emulator, 22 completed, one failed (a
#     declined card), one needs_review (its key used first with other
#     parameters), with their journal, a snapshot, the proxy's ledger (a
#     budget, a key, a settled and a reserved charge, their audit) and an
#     applied Stripe event;
#   - records in flight for 2031-02: 8 requests executing at a slow
#     emulator (10 s) when the server stops ('fast', as an operator stops
#     it), so they reach it and their answers are lost; 4 claimed ahead of
#     them and never sent; the other 12 pending.
# After the upgrade (the new server first started without its API key, so
# that nothing is sent while it is compared):
#   - every row of every table is as it was when the old server stopped;
#   - pg_dump --schema-only of the database equals a fresh install on the
#     new major;
#   - with the API key, the new server's dispatcher sends what was in flight
#     with the same keys and bodies: the 8 the emulator executed are
#     answered from its idempotency cache (replayed, the original charge
#     id), no request conflicts, and no key has a second charge.
# A restored database is a restore: it waits to be adopted
# (billguard.adopt_database()) after the original stopped billing.
#
# pg_upgrade from 17.12 (trixie) to 18.6 (forky) fails while it restores the
# schema, whatever the database holds (see docs/postgresql-upgrades.md): there
# the scenario proves that the refusal is clean, the old cluster starts with
# every row and bills what was in flight, once; dump and restore is the way.
use strict;
use warnings;
use Cwd qw(getcwd);
use File::Basename qw(basename);
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;
use DatabaseContents;

my ($new_major) = `pg_config --version` =~ /^PostgreSQL (\d+)/ or die 'pg_config --version: no major';

# The major upgraded from: the newest one installed below this one with
# billguard built and installed for it.
sub pg_config_of { my ($dir, $what) = @_; my $v = `$dir/bin/pg_config --$what`; chomp $v; return $v }
my ($old_install) = grep {
	my $m = basename($_);
	$m =~ /^\d+$/ && $m < $new_major && -x "$_/bin/pg_config"
	  && -e pg_config_of($_, 'pkglibdir') . '/billguard.so'
	  && -e pg_config_of($_, 'sharedir') . '/extension/billguard.control'
} sort { basename($b) <=> basename($a) } glob('/usr/lib/postgresql/*');
plan skip_all => "no PostgreSQL major before $new_major with billguard is installed here: "
  . 'this scenario runs in the chroots of test/majors (15 -> 17 in trixie, 17 -> 18 in forky)'
  unless $old_install;
my $old_major = basename($old_install);
my $new_bindir = `pg_config --bindir`;
chomp $new_bindir;
note("upgrading from PostgreSQL " . `$old_install/bin/postgres --version` . "to " . `$new_bindir/postgres --version`);

sub default_version_of {
	my ($sharedir) = @_;
	my ($version) = slurp_file("$sharedir/extension/billguard.control") =~ /^default_version\s*=\s*'([^']+)'/m;
	return $version;
}
is(default_version_of(pg_config_of($old_install, 'sharedir')), default_version_of(`pg_config --sharedir` =~ s/\n//r),
	"billguard for $old_major is the version built for $new_major");

my ($done, $open) = ('2031-01', '2031-02');
my $accounts = 24;
my $in_flight = 8;

sub sq { my ($node, $db, $sql) = @_; return $node->safe_psql($db, $sql) }

# status=count of a period's records, by status.
sub statuses {
	my ($node, $db, $period) = @_;
	return sq($node, $db, qq{SELECT string_agg(status || '=' || n, ',' ORDER BY status)
		FROM (SELECT status, count(*) n FROM billguard.billing_records WHERE billing_period = '$period' GROUP BY 1) s});
}

sub settled {
	my ($node, $db, $period) = @_;
	return wait_until("$period settled", 120, sub {
		sq($node, $db, qq{SELECT count(*) FROM billguard.billing_records
			WHERE billing_period = '$period' AND status IN ('pending', 'dispatching', 'unknown')}) eq '0' });
}

# ---- the old cluster ---------------------------------------------------------------

# A started cluster of the old major billing database postgres through $emulator.
sub old_cluster {
	my ($name, $emulator) = @_;
	my $node = BillguardNode->dispatching($name, $emulator, { install_path => $old_install },
		"billguard.max_inflight = $in_flight", "billguard.request_timeout = '60s'");
	$node->add_accounts($accounts);
	$node->q1(q{UPDATE billguard.accounts SET payment_method = 'pm_card_chargeDeclined' WHERE customer_id = 'cust_000001'});
	return $node;
}

# 2031-01 settled: completed, failed and needs_review, and what else a
# database's history holds.
sub make_history {
	my ($node, $emulator, $label) = @_;
	# Someone used cust_000002's key first, with another amount.
	my $foreign = $emulator->post_form('/v1/payment_intents',
		StripeEmulatorHarness::payment_intent_params(amount => 999, customer => 'cus_foreign'),
		idempotency_key => $node->key_of('cust_000002', $done), api_key => $StripeEmulatorHarness::DEFAULT_API_KEY);
	is($foreign->{status}, 200, "$label: cust_000002's key was used first with other parameters");
	is($node->q1("SELECT initiated FROM billguard.bill_period('$done')"), $accounts, "$label: $done claimed");
	ok(settled($node, 'postgres', $done), "$label: and settled");
	is(statuses($node, 'postgres', $done), 'completed=22,failed=1,needs_review=1',
		"$label: $done completed, one failed (declined), one needs_review (the key's first use differs)");
	$node->q1("SELECT billguard.save_snapshot('billing-cust_000003-$done')");
	$node->add_vault_ledger($done, qq{
		INSERT INTO billguard.stripe_events (event_id, event_type, object_id, customer_id, billing_period,
		                                     idempotency_key, effect, stripe_created_at)
		SELECT 'evt_upgrade', 'payment_intent.succeeded', charge_id, customer_id, billing_period,
		       idempotency_key, 'confirmed', now()
		  FROM billguard.billing_records WHERE customer_id = 'cust_000003' AND billing_period = '$done'});
	is($node->q1(qq{SELECT settled_cents || '/' || reserved_cents FROM billguard.vault_spend WHERE billing_period = '$done'}),
		'1000/2000', "$label: the proxy's ledger holds a settled and a reserved charge");
	is($node->q1('SELECT count(*) FROM billguard.snapshots') > 0 ? 'yes' : 'no', 'yes', "$label: a snapshot is kept");
}

# A server that starts takes the records a stopped one left dispatching
# over: it ends their lease (next_attempt_at, lease_expires_at and
# updated_at), and changes nothing else of them until it sends them. The
# rows are compared without those three of such records.
my $lease_taken_over = sub {
	return $_[0] =~ s/\b(next_attempt_at|lease_expires_at|updated_at)\b/CASE WHEN status <> 'dispatching' THEN $1 END AS $1/gr;
};

# 2031-02 billed at an emulator that takes 10 s per charge, and the server
# stopped while 8 requests execute there. Returns the rows as they were
# when it stopped, the record keys of 2031-02 with their frozen bodies, and
# key => the object each request that reached the emulator created.
sub stop_in_flight {
	my ($node, $emulator, $label) = @_;
	$emulator->configure(latency_ms => 10000);
	is($node->q1("SELECT initiated FROM billguard.bill_period('$open')"), $accounts, "$label: $open claimed");
	ok(wait_until("$in_flight requests executing", 30, sub { $emulator->stats->{in_progress} == $in_flight }),
		"$label: $in_flight requests execute at the emulator");
	my $ahead = $in_flight / 2;
	is(statuses($node, 'postgres', $open), 'dispatching=' . ($in_flight + $ahead) . ',pending=' . ($accounts - $in_flight - $ahead),
		"$label: $in_flight records sent, $ahead claimed ahead of them, the others pending");
	my $rows = table_rows($node, 'postgres', billing_records => $lease_taken_over);
	$rows->{billing_records}{columns} = $lease_taken_over->($rows->{billing_records}{columns});
	my $bodies = bodies_of($node, 'postgres');
	$node->stop('fast');
	ok(wait_until('the abandoned requests executed', 30, sub { $emulator->stats->{in_progress} == 0 }),
		"$label: the stopped server's requests executed at the emulator, their answers lost");
	$emulator->configure(latency_ms => 0);
	my %reached;
	for my $key (keys %$bodies) {
		my $objects = ledger_for_key($emulator, $key);
		$reached{$key} = $objects->[0] if @$objects;
		is(scalar(@$objects), 1, "$label: one object at the emulator for $key") if @$objects > 1;
	}
	is(scalar(keys %reached), $in_flight, "$label: the emulator holds an object for each of the $in_flight requests sent");
	return ($rows, $bodies, \%reached);
}

# key => the frozen request body of each record of 2031-02 claimed (the
# body is frozen when a record is claimed).
sub bodies_of {
	my ($node, $db) = @_;
	return { map { split / /, $_, 2 } split /\n/, sq($node, $db, qq{
		SELECT idempotency_key || ' ' || request_body FROM billguard.billing_records
		 WHERE billing_period = '$open' AND request_body IS NOT NULL}) };
}

# ---- the new cluster ----------------------------------------------------------------

# A cluster of this major, not started, configured as the old one was but
# serving $database and without its API key (returned, for later): nothing
# is sent until the rows are compared. Without data checksums, as the old
# cluster has none (18's initdb turns them on; pg_upgrade needs both alike).
sub new_cluster {
	my ($name, $emulator, $database) = @_;
	my $node = BillguardNode->new($name);
	$node->init(no_data_checksums => 1);
	my $key_file = $node->set_api_key($StripeEmulatorHarness::DEFAULT_API_KEY);
	$node->append_conf('postgresql.conf', join("\n",
		"shared_preload_libraries = 'billguard'", 'fsync = off', 'max_connections = 50',
		"billguard.database = '$database'", "billguard.api_base = '" . $emulator->url('') . "'",
		"billguard.api_key_file = ''", 'billguard.max_requests_per_second = 2000',
		"billguard.max_inflight = $in_flight", "billguard.poll_interval = '200ms'", "billguard.request_timeout = '60s'"));
	return ($node, $key_file);
}

# pg_upgrade from the stopped $old to $new in $mode (link or copy); returns
# whether it succeeded and what it wrote, its logs included when it failed.
sub pg_upgrade {
	my ($old, $new, $mode) = @_;
	my $cwd = getcwd();
	chdir $new->basedir or die 'cannot enter ' . $new->basedir;
	my $ok = IPC::Run::run([ "$new_bindir/pg_upgrade", "--$mode", '--no-sync',
			'-b', "$old_install/bin", '-B', $new_bindir, '-d', $old->data_dir, '-D', $new->data_dir,
			'-s', $new->host, '-p', $old->port, '-P', $new->port ],
		'>', \my $out, '2>&1');
	chdir $cwd;
	$out .= join('', map { "---- $_\n" . slurp_file($_) } glob($new->data_dir . '/pg_upgrade_output.d/*/log/*.log')) unless $ok;
	return ($ok, $out);
}

# pg_upgrade restores every function and view from the text the old server
# deparses it to: a SQL-standard body (RETURN ..., BEGIN ATOMIC) or a view's
# query is parsed again and may be stored as another tree of the same
# expression (x BETWEEN a AND b, or a row comparison, inside a longer AND
# comes back as comparisons of the one flat AND), in pg_upgrade within one
# major too. The fresh install's functions and views make the same round
# trip through their text before the schemas are compared; which ones it
# changed is noted.
sub round_trip_through_text {
	my ($node, $db, $label) = @_;
	my %definition_of = (
		map({ ($_ => "SELECT pg_get_functiondef('$_'::regprocedure)") } split /\n/, sq($node, $db, q{
			SELECT p.oid::regprocedure FROM pg_proc p
			 WHERE p.pronamespace = 'billguard'::regnamespace AND p.prosqlbody IS NOT NULL ORDER BY 1})),
		map({ ($_ => "SELECT 'CREATE OR REPLACE VIEW $_ AS ' || pg_get_viewdef('$_'::regclass)") } split /\n/, sq($node, $db, q{
			SELECT c.oid::regclass FROM pg_class c
			 WHERE c.relnamespace = 'billguard'::regnamespace AND c.relkind = 'v' ORDER BY 1})));
	my %before = map { ($_ => sq($node, $db, $definition_of{$_})) } keys %definition_of;
	sq($node, $db, $before{$_}) for sort keys %before;
	my @changed = grep { sq($node, $db, $definition_of{$_}) ne $before{$_} } sort keys %before;
	note("$label: of " . scalar(keys %before) . ' functions and views, a dump and restore stores these in another shape: '
		. (join(', ', @changed) || 'none'));
}

sub init_privs_of_schema {
	my ($node, $db) = @_;
	return sq($node, $db, q{SELECT coalesce(string_agg(privtype::text || ' ' || initprivs::text, ', '), '')
		FROM pg_init_privs WHERE classoid = 'pg_namespace'::regclass AND objoid = 'billguard'::regnamespace});
}

# A dump without its ACL entries that set no privilege.
sub without_empty_acl_entries {
	my ($dump) = @_;
	return $dump =~ s/--\n-- Name: [^\n]*; Type: ACL;[^\n]*\n--\n\nSELECT pg_catalog\.binary_upgrade_set_record_init_privs\(true\);\nSELECT pg_catalog\.binary_upgrade_set_record_init_privs\(false\);\n\n\n//gr;
}

# The database of $node is the fresh install of billguard on this major:
# the same schema, the same tables dumped with their data. $restored_from_text:
# the database's functions and views were made from their dumped text
# (pg_upgrade).
sub same_as_fresh {
	my ($node, $db, $label, $restored_from_text) = @_;
	sq($node, 'postgres', 'CREATE DATABASE fresh');
	sq($node, 'fresh', 'CREATE EXTENSION billguard');
	if ($restored_from_text) {
		round_trip_through_text($node, 'fresh', $label);
		# CREATE EXTENSION records the initial privileges of the schema it
		# creates (pg_init_privs, privtype 'e'); a binary upgrade restores
		# those of the extension's members only, and the schema is none.
		# The dump shows it as an ACL entry of the schema that grants and
		# revokes nothing; the privileges are the same. Such empty entries
		# are left out.
		note("$label: pg_init_privs of schema billguard: upgraded '" . init_privs_of_schema($node, $db)
			. "', fresh '" . init_privs_of_schema($node, 'fresh') . "'");
	}
	same_schema($node, $db, 'fresh', "$label, on $new_major", $restored_from_text ? \&without_empty_acl_entries : undef);
	sq($node, 'postgres', 'DROP DATABASE fresh');
}

# With its API key $node sends what was in flight: the same keys and bodies,
# the requests the emulator executed answered from its cache with the
# original charge, one charge per key in all.
sub sends_what_was_in_flight {
	my ($node, $db, $emulator, $key_file, $bodies, $reached, $label) = @_;
	my $conflicts = $emulator->stats->{idempotency_conflicts};
	sq($node, 'postgres', "ALTER SYSTEM SET billguard.api_key_file = '$key_file'");
	sq($node, 'postgres', 'SELECT pg_reload_conf()');
	ok(settled($node, $db, $open), "$label: $open, in flight when the old server stopped, settles on the new one");
	is(statuses($node, $db, $open), 'completed=23,failed=1', "$label: $open completed, the declined card failed");
	is(statuses($node, $db, $done), 'completed=22,failed=1,needs_review=1', "$label: $done as it was");
	my $now = bodies_of($node, $db);
	is(scalar(keys %$bodies), $in_flight * 3 / 2, "$label: the " . ($in_flight * 3 / 2) . ' records claimed before the stop had frozen bodies');
	is_deeply({ map { ($_ => $now->{$_}) } keys %$bodies }, $bodies,
		"$label: each of them kept its key and its frozen body, and was sent with them");
	is($emulator->stats->{idempotency_conflicts}, $conflicts,
		"$label: no request conflicted with its key's first use (the same parameters were sent again)");
	my $replays = 0;
	for my $key (sort keys %$reached) {
		my $original = $reached->{$key};
		my ($status, $charge, $replayed) = split /\|/, sq($node, $db, qq{
			SELECT r.status || '|' || coalesce(r.charge_id, '') || '|' || coalesce(string_agg(j.event ->> 'replayed', ','), '')
			  FROM billguard.billing_records r
			  LEFT JOIN billguard.journal j ON j.persistence_id = 'billing-' || r.customer_id || '-' || r.billing_period
			                                AND j.event_type IN ('BillingCompleted', 'BillingFailed')
			 WHERE r.idempotency_key = '$key' GROUP BY r.status, r.charge_id});
		next if ($original->{status} // '') ne 'succeeded';
		$replays++ if $status eq 'completed' && $charge eq $original->{id} && $replayed eq 'true';
	}
	my $succeeded = grep { ($_->{status} // '') eq 'succeeded' } values %$reached;
	is($replays, $succeeded, "$label: each of the $succeeded charges executed for the stopped server completed its record,"
		. ' replayed, with its id');
	my $by_key = charges_by_key($emulator);
	is(join(',', grep { length && @{ $by_key->{$_} } != 1 } sort keys %$by_key), '', "$label: no key was charged twice");
	my %record_charge = map { split /\|/ } split /\n/, sq($node, $db,
		q{SELECT idempotency_key || '|' || charge_id FROM billguard.billing_records WHERE status = 'completed'});
	is(scalar(keys %record_charge), 45, "$label: 45 records completed in both periods");
	is(scalar(grep { ($by_key->{$_}[0] // '') ne $record_charge{$_} } keys %record_charge), 0,
		"$label: each carries the one charge its key has at the emulator");
}

# ---- pg_upgrade, --link and --copy --------------------------------------------------

# 17.12 (trixie's) keeps an attribute version in the options of every
# column of every table (pg_attver=N in pg_attribute.attoptions); 18.6
# (forky's), older than that release, rejects the option when pg_upgrade
# restores the schema. Known by its message.
my $known_refusal = qr/ERROR:  unrecognized parameter "pg_attver"/;

for my $mode ('link', 'copy') {
	my $label = "$old_major -> $new_major, pg_upgrade --$mode";
	my $emulator = start_emulator();
	my $old = old_cluster("old_$mode", $emulator);
	make_history($old, $emulator, $label);
	my ($rows, $bodies, $reached) = stop_in_flight($old, $emulator, $label);
	my ($new, $key_file) = new_cluster("new_$mode", $emulator, 'postgres');
	my ($upgraded, $log) = pg_upgrade($old, $new, $mode);
	if (!$upgraded && $log =~ $known_refusal) {
		pass("$label: refused: $new_major rejects the attribute versions $old_major stored (docs/postgresql-upgrades.md)");
		like($log, qr/Failure, exiting/, "$label: pg_upgrade says it failed and stops");
		ok(!-e $old->data_dir . '/global/pg_control.old', "$label: the old cluster was not taken over (no pg_control.old)");
		# The old cluster is as it was: it starts, keeps every row, and its
		# dispatcher sends what was in flight, once.
		$old->append_conf('postgresql.conf', "billguard.api_key_file = ''");
		$old->start;
		cmp_ok($old->q1(q{SELECT count(*) FROM pg_attribute WHERE attrelid = 'billguard.billing_records'::regclass
			AND attnum > 0 AND array_to_string(attoptions, ',') LIKE '%pg_attver=%'}), '>', 0,
			"$label: the old cluster's columns carry the attribute option");
		rows_intact($old, 'postgres', $rows, "$label, the old cluster after the refusal");
		sends_what_was_in_flight($old, 'postgres', $emulator, $old->basedir . '/stripe.key', $bodies, $reached, "$label, refused");
		$old->stop;
		$emulator->stop;
		next;
	}
	ok($upgraded, "$label: pg_upgrade succeeds") or diag($log);
	$new->start;
	is($new->q1("SELECT extversion FROM pg_extension WHERE extname = 'billguard'"),
		default_version_of(`pg_config --sharedir` =~ s/\n//r), "$label: billguard is at its version on the new server");
	rows_intact($new, 'postgres', $rows, $label);
	same_as_fresh($new, 'postgres', $label, 'restored from text');
	sends_what_was_in_flight($new, 'postgres', $emulator, $key_file, $bodies, $reached, $label);
	$new->stop;
	$emulator->stop;
}

# ---- pg_dump and pg_restore into the new major --------------------------------------

{
	my $label = "$old_major -> $new_major, pg_dump and pg_restore";
	my $emulator = start_emulator();
	my $old = old_cluster('old_dump', $emulator);
	make_history($old, $emulator, $label);
	my ($rows, $bodies, $reached) = stop_in_flight($old, $emulator, $label);
	# The original stops billing before the restore is adopted: started
	# again without its API key only to be dumped.
	$old->append_conf('postgresql.conf', "billguard.api_key_file = ''");
	$old->start;
	rows_intact($old, 'postgres', $rows, "$label, the original started again to be dumped");
	my ($new, $key_file) = new_cluster('new_dump', $emulator, '');
	$new->start;
	my $dump = $new->basedir . '/billing.dump';
	command_ok([ "$new_bindir/pg_dump", '-Fc', '-f', $dump, '-d', $old->connstr('postgres') ],
		"$label: pg_dump of $new_major dumps the database of $old_major");
	my $original_installation = $old->q1('SELECT installation_id FROM billguard.installation');
	$old->stop;
	sq($new, 'postgres', 'CREATE DATABASE billing');
	command_ok([ "$new_bindir/pg_restore", '--exit-on-error', '-d', $new->connstr('billing'), $dump ],
		"$label: pg_restore of it reports no error");
	rows_intact($new, 'billing', $rows, $label, 'installation', 'billing_installations');
	like(sq($new, 'billing', 'SELECT string_agg(installation_id::text, \',\') FROM billguard.billing_installations'),
		qr/\Q$original_installation\E/, "$label: the history names the installation that billed it");
	same_as_fresh($new, 'billing', $label);
	ok(wait_until('the restore waits to be adopted', 30, sub {
		(sq($new, 'billing', 'SELECT pause_reason FROM billguard.dispatch_status') // '') =~ /restored from a dump/ }),
		"$label: the restored database waits to be adopted");
	like(sq($new, 'billing', 'SELECT billguard.adopt_database()'), qr/^adopted/, "$label: adopted");
	sends_what_was_in_flight($new, 'billing', $emulator, $key_file, $bodies, $reached, $label);
	$new->stop;
	$emulator->stop;
}

done_testing();

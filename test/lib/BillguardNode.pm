# A PostgreSQL::Test::Cluster node with billguard preloaded, and the queries
# the TAP scenarios (test/t/*.pl) ask of one: its billing records, journal,
# dispatcher and settings. Scenarios create their nodes here rather than
# repeating the set-up, so every node is configured the same way:
#
#   my $node = BillguardNode->preloaded('name');              # extension created
#   my $node = BillguardNode->dispatching('name', $emulator);  # and its dispatcher charges through $emulator
#   $node->add_accounts(30);
#   is($node->bill('cust_000001', '2031-03'), 'initiated');
#   ok($node->wait_until_settled('2031-03'));
package BillguardNode;

use strict;
use warnings;
use parent -norequire, 'PostgreSQL::Test::Cluster';
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use IPC::Run;
use JSON::PP;
use Time::HiRes ();
use Test::More;

use lib "$ENV{BILLGUARD_ROOT}/test/emulator/lib";
use StripeEmulatorHarness;
use BillguardTest qw(wait_until);
use SecretFile qw(write_secret_file);

# ---- nodes ----------------------------------------------------------------

# A started node with billguard preloaded and created in database postgres.
# Options, if the first of @conf is a hash: extension_version => '0.1.0'
# creates that version instead of the default; allows_streaming => 1 makes a
# primary a streaming replica can be made from; install_path => DIR runs the
# PostgreSQL installed there (another major) instead of the one on PATH.
# $before_start, if given next,
# runs with the initialised node before it starts and returns more
# postgresql.conf lines. The remaining @conf lines come last and so win.
sub preloaded {
	my ($class, $name, @conf) = @_;
	my %options = ref $conf[0] eq 'HASH' ? %{ shift @conf } : ();
	my $before_start = ref $conf[0] eq 'CODE' ? shift @conf : sub { () };
	my $node = $class->new($name,
		$options{install_path} ? (install_path => $options{install_path}) : ());
	$node->init(allows_streaming => $options{allows_streaming} // 0);
	$node->append_conf('postgresql.conf', join("\n",
		"shared_preload_libraries = 'billguard'",
		"fsync = off",
		"max_connections = 50",
		$before_start->($node),
		@conf));
	$node->start;
	my $version = $options{extension_version} ? " VERSION '$options{extension_version}'" : '';
	$node->safe_psql('postgres', "CREATE EXTENSION billguard$version");
	return $node;
}

# The dispatcher's settings in the scenarios, whatever it charges through:
# it serves database postgres, polls often and paces little.
sub dispatcher_conf {
	return ("billguard.database = 'postgres'",
		"billguard.max_requests_per_second = 2000",
		"billguard.max_inflight = 32",
		"billguard.poll_interval = '200ms'",
		"billguard.request_timeout = '5s'");
}

# A started node whose dispatcher charges through $emulator, with the
# extension created. @conf lines override the test defaults; an options hash
# may come first, as for preloaded.
sub dispatching {
	my ($class, $name, $emulator, @conf) = @_;
	my @options = ref $conf[0] eq 'HASH' ? (shift @conf) : ();
	return $class->preloaded($name, @options, sub {
		my ($node) = @_;
		my $key_file = $node->set_api_key($StripeEmulatorHarness::DEFAULT_API_KEY);
		return (dispatcher_conf(),
			"billguard.api_base = '" . $emulator->url('') . "'",
			"billguard.api_key_file = '$key_file'");
	}, @conf);
}

# Writes the API key file the dispatcher reads (a reload picks it up).
sub set_api_key {
	my ($self, $key) = @_;
	return write_secret_file($self->basedir . '/stripe.key', $key);
}

# ALTER SYSTEM SET (or, for undef, RESET) billguard.<name> for each setting, then reload.
sub reload_with {
	my ($self, %settings) = @_;
	$self->q1(join('; ', map {
		defined $settings{$_} ? "ALTER SYSTEM SET billguard.$_ = '$settings{$_}'" : "ALTER SYSTEM RESET billguard.$_"
	} sort keys %settings));
	$self->q1('SELECT pg_reload_conf()');
	Time::HiRes::sleep(0.3);    # the dispatcher picks SIGHUP up in its next loop
	return;
}

# Sets billguard.max_requests_per_second to $rate (undef: its default) and reloads.
sub set_rate {
	my ($self, $rate) = @_;
	return $self->reload_with(max_requests_per_second => $rate);
}

# ---- queries ----------------------------------------------------------------

# The result of $sql in database postgres (dies on error).
sub q1 {
	my ($self, $sql) = @_;
	return $self->safe_psql('postgres', $sql);
}

# Inserts $count active accounts cust_000001.. with stripe customers cus_...
sub add_accounts {
	my ($self, $count, $prefix) = @_;
	$prefix //= 'cust_';
	$self->q1(qq{
		INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
		SELECT '$prefix' || lpad(g::text, 6, '0'), 'cus_' || lpad(g::text, 6, '0'),
		       1000 + g % 500, 'usd', 'pm_card_visa'
		  FROM generate_series(1, $count) g});
	return;
}

# Bills $customer for $period; returns the status bill_customer answers.
# The spend-cap ledger of $period as the proxy leaves it: a budget, a vault
# key, a settled and a reserved charge, their audit. $more, SQL run after it
# in the same session, finds the key in temporary table k.
sub add_vault_ledger {
	my ($self, $period, $more) = @_;
	$self->q1(qq{
		CREATE TEMP TABLE k AS SELECT * FROM billguard.issue_vault_key('stripe', '$period', 500,
		  ARRAY['/v1/payment_intents'], now() + interval '40 days', false);
		SELECT a.decision, billguard.vault_settle(a.key_id, 'settled-key', 200, NULL, 'pi_settled',
		                                          '{"id": "pi_settled"}', 'req_settled', a.attempt)
		  FROM k, billguard.vault_authorize(sha256(convert_to(k.vault_key, 'UTF8')), 'POST',
		         '/v1/payment_intents', 'settled-key', repeat('a', 64), 1000, 'usd', 'cus_1', 'settled-key') a;
		SELECT a.decision
		  FROM k, billguard.vault_authorize(sha256(convert_to(k.vault_key, 'UTF8')), 'POST',
		         '/v1/payment_intents', 'reserved-key', repeat('b', 64), 2000, 'usd', 'cus_2', 'reserved-key') a;
		} . ($more // ''));
	return;
}

sub bill {
	my ($self, $customer, $period) = @_;
	return $self->q1("SELECT status FROM billguard.bill_customer('$customer', '$period')");
}

# The idempotency key billguard derives for $customer and $period.
sub key_of {
	my ($self, $customer, $period) = @_;
	return $self->q1("SELECT billguard.idempotency_key('$customer', '$period')");
}

# The status of the billing record of $customer and $period ('' when none).
sub status_of {
	my ($self, $customer, $period) = @_;
	return $self->q1(
		"SELECT status FROM billguard.billing_records WHERE customer_id = '$customer' AND billing_period = '$period'");
}

# status|charge_id|attempts of one record.
sub record_of {
	my ($self, $customer, $period) = @_;
	return $self->q1(qq{
		SELECT status || '|' || coalesce(charge_id, '') || '|' || attempts FROM billguard.billing_records
		 WHERE customer_id = '$customer' AND billing_period = '$period'});
}

# The number of billing records of $period.
sub records_of {
	my ($self, $period) = @_;
	return $self->q1("SELECT count(*) FROM billguard.billing_records WHERE billing_period = '$period'");
}

# "status=count, ..." of the records of $period.
sub statuses_of {
	my ($self, $period) = @_;
	return $self->q1(qq{
		SELECT string_agg(status || '=' || n, ', ' ORDER BY status)
		  FROM (SELECT status, count(*) n FROM billguard.billing_records WHERE billing_period = '$period' GROUP BY 1) s});
}

# How many rows of $table say each outcome in $column, those beginning
# 'refused:' counted together as 'refused': { outcome => count }.
sub outcome_counts {
	my ($self, $table, $column) = @_;
	return { map { split /\|/ } split /\n/, $self->q1(qq{
		SELECT kind || '|' || count(*)
		  FROM (SELECT CASE WHEN $column LIKE 'refused:%' THEN 'refused' ELSE $column END AS kind FROM $table) o
		 GROUP BY kind}) };
}

# One entity's event types in seq_nr order, comma-separated, each with "(value)" of every one of @fields it has.
sub event_types {
	my ($self, $customer, $period, @fields) = @_;
	my $entry = join(' || ', 'event_type', map { "coalesce('(' || (event ->> '$_') || ')', '')" } @fields);
	return $self->q1(qq{
		SELECT string_agg($entry, ',' ORDER BY seq_nr) FROM billguard.journal
		 WHERE persistence_id = 'billing-$customer-$period'});
}

# The events of one type of one entity, decoded, in seq_nr order.
sub events_of {
	my ($self, $customer, $period, $type) = @_;
	my $rows = $self->q1(qq{
		SELECT event::text FROM billguard.journal
		 WHERE persistence_id = 'billing-$customer-$period' AND event_type = '$type' ORDER BY seq_nr});
	return [ map { decode_json($_) } grep { length } split /\n/, $rows ];
}

# How many BillingTickIssued events billing-scheduler holds for $period.
sub ticks_issued {
	my ($self, $period) = @_;
	return $self->q1(qq{
		SELECT count(*) FROM billguard.journal
		 WHERE persistence_id = 'billing-scheduler' AND event_type = 'BillingTickIssued'
		   AND event ->> 'billing_period' = '$period'});
}

# ---- billguard's processes --------------------------------------------------

# The running dispatcher's pid, or '' when none runs.
sub dispatcher_pid {
	my ($self) = @_;
	return $self->q1(
		"SELECT coalesce(max(pid), 0) FROM pg_stat_activity WHERE backend_type = 'billguard dispatcher'") || '';
}

# Waits for a dispatcher other than $old_pid to run; returns its pid, or 0.
sub wait_for_new_dispatcher {
	my ($self, $old_pid, $timeout) = @_;
	my $pid = 0;
	wait_until('a dispatcher other than ' . ($old_pid || 'none'), $timeout // 30, sub {
		$pid = $self->dispatcher_pid;
		return $pid && $pid ne '0' && $pid ne ($old_pid // '');
	});
	return $pid && $pid ne ($old_pid // '') ? $pid : 0;
}

# Waits until no record of $period is pending, dispatching or unknown.
sub wait_until_settled {
	my ($self, $period, $timeout) = @_;
	return wait_until("every record of $period settled", $timeout // 120, sub {
		$self->q1(qq{
			SELECT count(*) FROM billguard.billing_records
			 WHERE billing_period = '$period' AND status IN ('pending', 'dispatching', 'unknown')}) eq '0';
	}, interval => 0.1, explain => sub { "records of $period: " . $self->statuses_of($period) });
}

# The backend types of billguard's processes, comma-separated.
sub billguard_processes {
	my ($self) = @_;
	return $self->q1(q{
		SELECT coalesce(string_agg(backend_type, ',' ORDER BY backend_type), '')
		  FROM pg_stat_activity WHERE backend_type LIKE 'billguard%'});
}

# Whether the dispatcher logged that the answer for $customer/$period waits
# for a row lock another session holds.
sub answer_waits_for_row_lock {
	my ($self, $customer, $period) = @_;
	return slurp_file($self->logfile)
	  =~ /billguard dispatcher: \Q$customer\/$period\E: another session holds its row lock/;
}

# ---- races ------------------------------------------------------------------

# A session holding an exclusive advisory lock; racers wait on it and all
# start when release_gate() terminates that session.
sub start_gate {
	my ($self) = @_;
	my $gate = IPC::Run::start(
		[ 'psql', '-XAtq', '-d', $self->connstr('postgres'),
		  '-c', "SET application_name = 'billguard_gate'",
		  '-c', 'SELECT pg_advisory_lock(424242), pg_sleep(600)' ],
		'>', \my $out, '2>', \my $err);
	$self->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_locks WHERE locktype = 'advisory' AND objid = 424242 AND granted")
	  or die 'gate did not take its lock';
	return $gate;
}

# Starts one racing psql session: it waits at the gate, then runs each of
# @sql in a transaction of its own.
sub race_psql {
	my ($self, @sql) = @_;
	my %r = (out => '', err => '');
	$r{handle} = IPC::Run::start(
		[ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $self->connstr('postgres'),
		  '-c', 'DO $$BEGIN PERFORM pg_advisory_lock_shared(424242); PERFORM pg_advisory_unlock_shared(424242); END$$',
		  map { ('-c', $_) } @sql ],
		'>', \$r{out}, '2>', \$r{err});
	return \%r;
}

# Waits until $waiting sessions queue at the gate, then opens it.
sub release_gate {
	my ($self, $gate, $waiting) = @_;
	$self->poll_query_until('postgres',
		"SELECT count(*) = $waiting FROM pg_locks WHERE locktype = 'advisory' AND objid = 424242 AND NOT granted")
	  or die "racers did not reach the gate";
	$self->q1("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'billguard_gate'");
	$gate->finish;
	return;
}

# An open psql session for a race decided by locks: send() a statement
# without waiting for it (it may block on a lock), done() for what it
# printed and what it said on stderr once it has finished, query() both at
# once. Errors do not end the session.
sub session {
	my ($self) = @_;
	my %s = (in => '', out => '', err => '', node => $self, marks => 0);
	$s{handle} = IPC::Run::start([ 'psql', '-XAtq', '-d', $self->connstr('postgres') ],
		'<', \$s{in}, '>', \$s{out}, '2>', \$s{err});
	my $session = bless \%s, 'BillguardNode::Session';
	($session->{pid}) = $session->query('SELECT pg_backend_pid()');
	return $session;
}

# Waits until $session waits for a lock (a row's, or an advisory one).
sub waits_for_lock {
	my ($self, $session, $timeout) = @_;
	return wait_until("session $session->{pid} to wait for a lock", $timeout // 30, sub {
		$self->q1("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $session->{pid}") eq 't';
	}, interval => 0.05);
}

package BillguardNode::Session;

use BillguardTest qw(wait_until);

sub send {
	my ($self, $sql) = @_;
	$self->{out} = '';
	$self->{err} = '';
	$self->{mark} = 'DONE_' . ++$self->{marks};
	$self->{in} .= "$sql;\n\\echo $self->{mark}\n";
	$self->{handle}->pump_nb;
	return;
}

# (printed, stderr) of the statement sent last, once it finished.
sub done {
	my ($self, $timeout) = @_;
	my $mark = $self->{mark};
	wait_until("the session's statement to finish", $timeout // 60,
		sub { $self->{handle}->pump_nb; $self->{out} =~ /^\Q$mark\E$/m }, interval => 0.02)
	  or die "session statement did not finish: $self->{err}";
	my ($printed) = $self->{out} =~ /\A(.*?)^\Q$mark\E$/ms;
	chomp $printed;
	return ($printed, $self->{err});
}

sub query {
	my ($self, $sql) = @_;
	$self->send($sql);
	return $self->done;
}

sub close {
	my ($self) = @_;
	$self->{in} .= "\\q\n";
	eval { $self->{handle}->finish };
	return;
}

1;

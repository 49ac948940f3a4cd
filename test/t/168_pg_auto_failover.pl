# Failover under the HA manager PostgreSQL users run: pg_auto_failover
# (Debian's postgresql-NN-auto-failover). A monitor and two nodes on
# loopback, billguard preloaded on both; the scheduler bills a period and
# the dispatcher sends it through the emulator, slowly; while it is under
# way, `pg_autoctl perform failover` swaps the nodes, and later a kill -9
# of the new primary's postmaster (pg_autoctl starts it again, or fails
# over). Nothing of billguard runs on the secondary; the dispatcher starts
# wherever the primary is; at the end the period is billed once: one
# BillingTickIssued, one record per account, one succeeded charge per key at
# the emulator, every record completed with it.
use strict;
use warnings;
use IPC::Run;
use JSON::PP;
use POSIX ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use SecretFile qw(write_secret_file);
use Time::HiRes qw(sleep time);
use BillguardTest;
use BillguardNode;
use SchedulerScenario;

plan skip_all => 'pg_autoctl is not installed (test/install-deps.sh installs postgresql-NN-auto-failover)'
  unless grep { -x "$_/pg_autoctl" } split /:/, $ENV{PATH};

my $accounts = 400;
my $period = '2031-08';
my $dir = PostgreSQL::Test::Utils::tempdir('pg_auto_failover');
my $sockets = PostgreSQL::Test::Utils::tempdir_short();
my %env = (XDG_CONFIG_HOME => "$dir/config", XDG_DATA_HOME => "$dir/share",
           XDG_RUNTIME_DIR => "$dir/run", PGHOST => $sockets);
mkdir $env{XDG_RUNTIME_DIR};

# The nodes run the PostgreSQL billguard is installed in. The monitor needs
# the pgautofailover extension, which Debian's package installs into the
# system's PostgreSQL of that major: a private PostgreSQL on PATH may lack it.
chomp(my $bindir = `pg_config --bindir`);
chomp(my $sharedir = `pg_config --sharedir`);
(my $major = `pg_config --version`) =~ s/^PostgreSQL (\d+).*/$1/s;
my $monitor_bindir = -e "$sharedir/extension/pgautofailover.control" ? $bindir : "/usr/lib/postgresql/$major/bin";

# ---- processes, stopped by pid ---------------------------------------------------------

my @services;    # pids of the pg_autoctl supervisors this test started, nodes first
END { stop_services() }

# SIGTERM to each supervisor: pg_autoctl stops its Postgres, then itself.
sub stop_services {
	while (my $pid = shift @services) {
		kill 'TERM', $pid;
		next if wait_until("pg_autoctl $pid to stop", 120, sub { waitpid($pid, POSIX::WNOHANG()) != 0 }, interval => 0.1);
		if (kill 0, $pid) {
			kill 'KILL', $pid;
			waitpid($pid, 0);
		}
	}
}

# Runs pg_autoctl to completion; dies with its output if it fails.
sub autoctl {
	my (@args) = @_;
	local @ENV{ keys %env } = values %env;
	my $out = '';
	IPC::Run::run([ 'pg_autoctl', @args ], '>&', \$out) or die "pg_autoctl @args failed:\n$out";
	return $out;
}

# Starts a pg_autoctl service in the background, its output in $log.
sub start_service {
	my ($log, @args) = @_;
	my $pid = fork() // die "fork: $!";
	if ($pid == 0) {
		@ENV{ keys %env } = values %env;
		open STDOUT, '>', $log or POSIX::_exit(126);
		open STDERR, '>&', \*STDOUT or POSIX::_exit(126);
		exec 'pg_autoctl', @args or POSIX::_exit(127);
	}
	unshift @services, $pid;
	return;
}

# ---- the nodes as SQL sees them -----------------------------------------------------------

{
	# A node that pg_autoctl, not the harness, runs: BillguardNode's queries
	# (they all go through safe_psql) on its own safe_psql.
	package AutoctlNode;
	use parent -norequire, 'BillguardNode';
	sub new { my ($class, %node) = @_; return bless {%node}, $class }
	sub name { $_[0]{name} }
	sub port { $_[0]{port} }
	sub pgdata { $_[0]{pgdata} }
	sub safe_psql {
		my ($self, $db, $sql) = @_;
		my ($out, $err) = ('', '');
		IPC::Run::run([ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-h', $sockets, '-p', $self->{port},
			'-d', $db, '-c', $sql ], '>', \$out, '2>', \$err)
		  or die "psql on $self->{name} failed: $err";
		chomp $out;
		return $out;
	}
	sub postmaster_pid {
		my ($self) = @_;
		open my $fh, '<', "$self->{pgdata}/postmaster.pid" or return 0;
		my $pid = <$fh>;
		chomp $pid;
		return $pid;
	}
}

# The monitor's view: node name => [reported state, assigned state].
sub states {
	my $json = eval { autoctl('show', 'state', '--pgdata', "$dir/monitor", '--json') } // return {};
	my $nodes = eval { decode_json($json) } // return {};
	return { map { ($_->{nodename} => [ $_->{current_group_state}, $_->{assigned_group_state} ]) } @$nodes };
}

# Polls $check every half second (each look at the monitor starts a
# pg_autoctl) for up to $timeout seconds.
sub poll_monitor {
	my ($what, $timeout, $check) = @_;
	return wait_until($what, $timeout, $check, interval => 0.5);
}

# Polls until the monitor reports %want (name => state, current and assigned).
sub wait_for_states {
	my ($what, %want) = @_;
	return poll_monitor($what, 240, sub {
		my $states = states();
		!grep { ($states->{$_}[0] // '') ne $want{$_} || ($states->{$_}[1] // '') ne $want{$_} } keys %want;
	});
}

# ---- monitor and nodes on loopback ----------------------------------------------------------

my $emulator = start_emulator(latency_ms => 100);
my $key_file = write_secret_file("$dir/stripe.key", $StripeEmulatorHarness::DEFAULT_API_KEY);

my $monitor_port = PostgreSQL::Test::Cluster::get_free_port();
system_or_bail("$monitor_bindir/initdb", '-D', "$dir/monitor", '-A', 'trust', '-N');
append_to_file("$dir/monitor/postgresql.conf", "unix_socket_directories = '$sockets'\nfsync = off\n");
autoctl('create', 'monitor', '--pgdata', "$dir/monitor", '--pgport', $monitor_port,
	'--pgctl', "$monitor_bindir/pg_ctl", '--hostname', '127.0.0.1', '--auth', 'trust', '--no-ssl');
autoctl('config', 'set', '--pgdata', "$dir/monitor", 'postgresql.listen_addresses', '127.0.0.1');
start_service("$dir/monitor.log", 'run', '--pgdata', "$dir/monitor");

# pg_autoctl's settings come first (an include at the top of
# postgresql.conf): ours, after it, win; node2 copies them with its base backup.
my %nodes;
for my $name ('node1', 'node2') {
	$nodes{$name} = AutoctlNode->new(name => $name, port => PostgreSQL::Test::Cluster::get_free_port(),
		pgdata => "$dir/$name");
}
system_or_bail("$bindir/initdb", '-D', "$dir/node1", '-A', 'trust', '-N');
append_to_file("$dir/node1/postgresql.conf", join("\n",
	"shared_preload_libraries = 'pg_stat_statements, billguard'",
	"unix_socket_directories = '$sockets'",
	'fsync = off',
	"shared_buffers = '64MB'",
	"billguard.database = 'postgres'",
	"billguard.api_base = '" . $emulator->url('') . "'",
	"billguard.api_key_file = '$key_file'",
	'billguard.max_requests_per_second = 20',
	'billguard.max_inflight = 8',
	"billguard.poll_interval = '200ms'",
	"billguard.request_timeout = '5s'") . "\n");

sub create_node {
	my ($name) = @_;
	start_service("$dir/$name.log", 'create', 'postgres', '--pgdata', "$dir/$name", '--pghost', $sockets,
		'--pgport', $nodes{$name}->port, '--pgctl', "$bindir/pg_ctl", '--hostname', '127.0.0.1',
		'--listen', '127.0.0.1', '--name', $name, '--auth', 'trust', '--no-ssl',
		'--monitor', "postgres://autoctl_node\@127.0.0.1:$monitor_port/pg_auto_failover", '--run');
}

create_node('node1');
ok(wait_for_states('node1 single', node1 => 'single'), 'node1 runs as a single node');
my $node1 = $nodes{node1};
$node1->safe_psql('postgres', 'CREATE EXTENSION billguard');
$node1->add_accounts($accounts);
create_node('node2');
ok(wait_for_states('node1 primary, node2 secondary', node1 => 'primary', node2 => 'secondary'),
	'node2 joins as the secondary');
my $node2 = $nodes{node2};
is($node2->billguard_processes, '', 'nothing of billguard runs on the secondary');

# ---- billing under way, then perform failover ------------------------------------------------

for my $node ($node1, $node2) {
	append_to_file($node->pgdata . '/postgresql.conf',
		scheduler_conf(auto_bill => 'monthly', scheduler_now => '2031-09-01 00:00:05+00') . "\n");
	$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
}
ok(wait_until("the scheduler to bill $period", 60, sub { $node1->records_of($period) == $accounts }),
	"node1's scheduler bills $period");
ok(wait_until('a quarter of the period completed', 120, sub {
	$node1->safe_psql('postgres', "SELECT count(*) FROM billguard.billing_records WHERE billing_period = '$period' AND status = 'completed'") >= $accounts / 4 }),
	'a quarter of the period is completed on node1');

autoctl('perform', 'failover', '--pgdata', "$dir/monitor", '--wait', '180');
ok(wait_for_states('node2 primary, node1 secondary', node1 => 'secondary', node2 => 'primary'),
	'perform failover: node2 is the primary, node1 the secondary');
ok(wait_until('a dispatcher on node2', 60, sub { $node2->billguard_processes =~ /billguard dispatcher/ }),
	'the dispatcher runs on the new primary');
is($node1->billguard_processes, '', 'nothing of billguard runs on the demoted node1');
my $completed = sub {
	my ($node) = @_;
	return $node->safe_psql('postgres', "SELECT count(*) FROM billguard.billing_records WHERE billing_period = '$period' AND status = 'completed'");
};
my $at_failover = $completed->($node2);
cmp_ok($at_failover, '<', $accounts, 'the period was still under way at the failover');

# ---- kill -9 of the new primary's postmaster -------------------------------------------------

ok(wait_until('node2 to complete more records', 120, sub { $completed->($node2) >= $at_failover + 20 }),
	'node2 completes records of the period');
my $postmaster = $node2->postmaster_pid;
cmp_ok($completed->($node2), '<', $accounts, 'the period is still under way at the kill -9');
ok(kill('KILL', $postmaster), "kill -9 of node2's postmaster ($postmaster)");

# pg_autoctl starts node2's Postgres again, or the monitor fails over to node1.
my $primary;
ok(poll_monitor('a primary with a dispatcher', 240, sub {
	my $states = states();
	my ($name) = grep { ($states->{$_}[0] // '') eq 'primary' && ($states->{$_}[1] // '') eq 'primary' } keys %$states;
	$primary = $name && $nodes{$name};
	# A Postgres pg_autoctl has just restarted refuses connections for a
	# moment ("starting up"): that is a reason to look again, not to die.
	$primary && $primary->postmaster_pid != $postmaster
	  && (eval { $primary->billguard_processes } // '') =~ /billguard dispatcher/;
}), 'after the kill -9 a primary runs a dispatcher again');
note('primary after the kill -9: ' . ($primary ? $primary->name : 'none'));

ok($primary->wait_until_settled($period, 240), 'the period settles on the primary');
billed_once($primary, $emulator, 'pg_auto_failover', $period, $accounts);

stop_services();
$emulator->stop;
done_testing();

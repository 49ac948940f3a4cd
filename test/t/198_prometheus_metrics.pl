# The operator's metrics: Debian's prometheus-postgres-exporter, run with
# monitoring/postgres_exporter.yaml as a role granted billing_monitor (and
# nothing else), scrapes a billing database while it bills: the records by
# period, status and currency equal billing_records, the dispatcher's pause
# and its reason show within one scrape, the oldest outstanding record's age
# grows while it is paused, spend against cap equals vault_spend. The output
# passes `promtool check metrics`; every metric the alert rules and the
# Grafana dashboard use is scraped; the alert rules pass `promtool check
# rules` and their own unit tests; no secret reaches the scrape.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use JSON::PP;
use BillguardTest;
use BillguardNode;

my $root = $ENV{BILLGUARD_ROOT};
my $monitoring = "$root/monitoring";
my $exporter_bin = '/usr/bin/prometheus-postgres-exporter';
plan skip_all => "$exporter_bin is not installed (test/install-deps.sh installs it)" unless -x $exporter_bin;

my $emulator = start_emulator();
my $node = BillguardNode->dispatching('metrics', $emulator);
$node->add_accounts(12);
$node->q1(q{UPDATE billguard.accounts SET currency = 'eur' WHERE customer_id > 'cust_000008'});
is($node->q1(q{SELECT initiated FROM billguard.bill_period('2031-03')}), '12', 'twelve records claimed');
ok($node->wait_until_settled('2031-03'), 'the period settles');
$node->add_vault_ledger('2031-03');

# The exporter's role: billing_monitor with the grants of docs/privileges.md
# as written there (its block names every job's role), and LOGIN.
my ($grants) = slurp_file("$root/docs/privileges.md") =~ /^## The grants\n.*?^```sql\n(.*?)^```\n/ms;
$node->q1(join('', map { "CREATE ROLE $_ NOLOGIN;" } qw(billing_app billing_accounts billing_ops billing_webhooks billing_monitor))
	. $grants . 'CREATE ROLE billguard_exporter LOGIN IN ROLE billing_monitor;');

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $dsn = 'postgresql://billguard_exporter@:' . $node->port . '/postgres?host=' . $node->host . '&sslmode=disable';
my $exporter_log = $node->basedir . '/exporter.log';
my $exporter = IPC::Run::start(
	[ $exporter_bin, "--web.listen-address=127.0.0.1:$port", "--extend.query-path=$monitoring/postgres_exporter.yaml",
		'--disable-default-metrics', '--disable-settings-metrics' ],
	'<', \undef, '>', $exporter_log, '2>&1',
	init => sub { $ENV{DATA_SOURCE_NAME} = $dsn });

sub scrape {
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'curl', '-sS', '--max-time', '10', "http://127.0.0.1:$port/metrics" ], '>', \$out, '2>', \$err);
	return $out;
}
# name{labels} value, for the billguard_ metrics of one scrape.
sub samples {
	my ($text) = @_;
	my %value;
	for (split /\n/, $text) {
		next unless /^(billguard_\w+)(\{[^}]*\})? (\S+)$/;
		$value{ $1 . ($2 // '') } = $3;
	}
	return \%value;
}
# The value of the one sample of $name whose labels include each of %labels.
sub value_of {
	my ($samples, $name, %labels) = @_;
	my @hits = grep {
		my $key = $_;
		$key =~ /^\Q$name\E(\{|$)/ && !grep { $key !~ /[{,]\Q$_\E="\Q$labels{$_}\E"/ } keys %labels
	} keys %$samples;
	return @hits == 1 ? $samples->{ $hits[0] } : scalar(@hits) . ' samples';
}

ok(wait_until('the exporter to serve billguard metrics', 30, sub { scrape() =~ /^billguard_dispatcher_running/m }),
	'the exporter serves billguard metrics')
  or diag(slurp_file($exporter_log));
my $text = scrape();
my $s = samples($text);
like($text, qr/^pg_exporter_user_queries_load_error\{[^}]*\} 0$/m, 'the queries file loads');
like($text, qr/^pg_exporter_last_scrape_error 0$/m, 'the scrape had no error');

is(value_of($s, 'billguard_billing_records', datname => 'postgres', billing_period => '2031-03',
	status => 'completed', currency => 'usd'), 8, 'records: 8 completed in usd');
is(value_of($s, 'billguard_billing_records', billing_period => '2031-03', status => 'completed', currency => 'eur'),
	4, 'records: 4 completed in eur');
is(value_of($s, 'billguard_billing_amount_cents', billing_period => '2031-03', status => 'completed', currency => 'eur'),
	$node->q1(q{SELECT sum(amount_cents) FROM billguard.billing_records WHERE currency = 'eur'}),
	'the eur amount is the sum of the records');
is(value_of($s, 'billguard_dispatcher_running', datname => 'postgres'), 1, 'the dispatcher runs');
is(value_of($s, 'billguard_dispatcher_paused', datname => 'postgres', reason => ''), 0, 'and is not paused');
is(value_of($s, 'billguard_dispatch_outstanding', datname => 'postgres'), 0, 'nothing outstanding');
is(value_of($s, 'billguard_dispatch_oldest_pending_age_seconds', datname => 'postgres'), 0, 'so no age');
cmp_ok(value_of($s, 'billguard_dispatch_requests_sent_total', datname => 'postgres'), '>=', 12,
	'the dispatcher counts its requests');
my ($cap, $committed, $settled, $reserved) = split /\|/,
	$node->q1(q{SELECT cap_cents, committed_cents, settled_cents, reserved_cents FROM billguard.vault_spend});
my %budget = (vendor => 'stripe', billing_period => '2031-03', currency => 'usd');
is(value_of($s, 'billguard_vault_cap_cents', %budget), $cap, "the budget's cap ($cap)");
is(value_of($s, 'billguard_vault_committed_cents', %budget), $committed, "committed ($committed)");
is(value_of($s, 'billguard_vault_settled_cents', %budget), $settled, "settled ($settled)");
is(value_of($s, 'billguard_vault_reserved_cents', %budget), $reserved, "reserved ($reserved)");

# promtool lints what the exporter serves of billguard's metrics.
my $ours = join('', grep { /^(# (HELP|TYPE) )?billguard_/ } split /^/, $text);
my ($lint_out, $lint_err) = ('', '');
my $linted = IPC::Run::run([ 'promtool', 'check', 'metrics' ], '<', \$ours, '>', \$lint_out, '2>', \$lint_err);
ok($linted, 'promtool check metrics passes') or diag("$lint_out$lint_err");

# Every metric the alert rules and the dashboard use is one the exporter serves.
my %served = map { /^(billguard_\w+)/ ? ($1 => 1) : () } keys %$s;
my $dashboard = decode_json(slurp_file("$monitoring/grafana/billguard.json"));
my @exprs = map { $_->{expr} } map { @{ $_->{targets} } } @{ $dashboard->{panels} };
push @exprs, map { $_->{definition} } grep { $_->{definition} } @{ $dashboard->{templating}{list} };
push @exprs, slurp_file("$monitoring/alerts.yml") =~ /^\s*expr: (.*)$/mg;
my %used = map { $_ => 1 } map { /\b(billguard_\w+)/g } @exprs;
ok(scalar(keys %used) >= 10, scalar(keys %used) . ' metrics are used by the dashboard and the alerts');
is(join(',', grep { !$served{$_} } sort keys %used), '', 'each of them is served');

# Paused: the key file readable by its group. The reason shows at the next
# scrape, and a record billed meanwhile ages.
my $key_file = $node->q1('SHOW billguard.api_key_file');
chmod 0640, $key_file or die "chmod $key_file: $!";
$node->reload;
ok(wait_until('the dispatcher to pause', 20, sub { $node->q1('SELECT paused FROM billguard.dispatch_status') eq 't' }),
	'the dispatcher pauses');
$node->q1(q{INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency)
            VALUES ('cust_198', 'cus_198', 990, 'usd')});
is($node->bill('cust_198', '2031-03'), 'initiated', 'a record billed while paused');
ok(wait_until('it to be over a second old', 10, sub {
		value_of(samples(scrape()), 'billguard_dispatch_oldest_pending_age_seconds') >= 1 }),
	'its age shows and grows');
$s = samples(scrape());
is(value_of($s, 'billguard_dispatch_outstanding'), 1, 'one record outstanding');
my @paused = grep { /^billguard_dispatcher_paused\{/ && $s->{$_} == 1 } keys %$s;
is(scalar(@paused), 1, 'the dispatcher is paused');
like($paused[0] // '', qr/reason="billguard\.api_key_file has group or world access \(mode 0640\)/,
	'with the reason as a label');
my $all = scrape();
my $api_key = $StripeEmulatorHarness::DEFAULT_API_KEY;
unlike($all, qr/\Q$api_key\E/, 'the scrape holds no API key');
unlike($all, qr/\Q$key_file\E/, 'nor the path of the key file');

# billing_monitor reads what the metrics need and nothing more.
my ($ok, $stdout, $stderr);
$node->psql('postgres', 'SELECT charge_id FROM billguard.billing_records',
	extra_params => [ '-U', 'billguard_exporter' ], stdout => \$stdout, stderr => \$stderr);
like($stderr, qr/permission denied/, 'billing_monitor cannot read charge ids');
$node->psql('postgres', q{SELECT billguard.bill_customer('cust_198', '2031-04')},
	extra_params => [ '-U', 'billguard_exporter' ], stdout => \$stdout, stderr => \$stderr);
like($stderr, qr/permission denied/, 'nor bill');

chmod 0600, $key_file or die "chmod $key_file: $!";
$node->reload;
ok($node->wait_until_settled('2031-03'), 'after chmod 600 and a reload the record settles');

# The alert rules: valid, and each fires on its series and only then.
for my $check ([ 'check', 'rules', "$monitoring/alerts.yml" ], [ 'test', 'rules', "$monitoring/alerts.test.yml" ]) {
	my ($out, $err) = ('', '');
	ok(IPC::Run::run([ 'promtool', @$check ], '>', \$out, '2>', \$err), "promtool @$check[0,1] passes")
	  or diag("$out$err");
}

$exporter->kill_kill;
done_testing();

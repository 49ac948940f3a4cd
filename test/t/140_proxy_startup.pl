# Starting billguard-proxy from its command line: it refuses
# to start, with one clear line and exit status 1, when a secret file is
# missing, too open or too short, the upstream is plain http to another
# host, or the database lacks the extension, its ledger (0.1.0) or the
# role's grants; --help and bad flags answer as documented; and it runs as
# a role with exactly the grants docs/privileges.md lists, which cannot do more.
use strict;
use warnings;
use File::Temp qw(tempdir);
use PostgreSQL::Test::Utils;
use Test::More;
use SecretFile qw(write_secret_file);
use BillguardTest;
use BillguardNode;
use ProxyHarness;

my $node = BillguardNode->preloaded('proxy_startup');
my $emulator = start_emulator();
my $dir = tempdir(CLEANUP => 1);
my $key = write_secret_file("$dir/stripe.key", $StripeEmulatorHarness::DEFAULT_API_KEY);
my $admin = write_secret_file("$dir/admin.token", 'a' x 40);
my %flags = ('--listen' => '127.0.0.1:0', '--database' => $node->connstr('postgres'),
	'--upstream' => $emulator->url(''), '--upstream-key-file' => $key, '--admin-token-file' => $admin);
sub refused {
	my (%changes) = @_;
	my %f = (%flags, %changes);
	return ProxyHarness->refused_start(map { defined $f{$_} ? ($_ => $f{$_}) : () } sort keys %f);
}

my ($status, $stderr) = ProxyHarness->refused_start('--help');
is($status, 0, '--help exits 0');
($status, $stderr) = ProxyHarness->refused_start('--listen');
is($status, 2, 'a flag without its value exits 2');
like($stderr, qr/^billguard-proxy: --listen needs a value\nusage: billguard-proxy/, '... saying so, then the usage');

# The issuer token is bounded by the operator, always.
my $issuer = write_secret_file("$dir/issuer.token", 'i' x 40);
for my $case (
	[ 'an issuer token without a ceiling', { '--issuer-token-file' => $issuer },
	  qr/--issuer-token-file needs --issuer-max-period-usd/ ],
	[ 'a ceiling of 0', { '--issuer-token-file' => $issuer, '--issuer-max-period-usd' => '0' },
	  qr/--issuer-max-period-usd must be a positive USD amount of whole cents/ ],
	[ 'a ceiling of fractions of a cent', { '--issuer-token-file' => $issuer, '--issuer-max-period-usd' => '1.005' },
	  qr/--issuer-max-period-usd must be a positive USD amount of whole cents/ ],
	[ 'a ceiling past the largest cap', { '--issuer-token-file' => $issuer, '--issuer-max-period-usd' => '20000000000000' },
	  qr/--issuer-max-period-usd must be a positive USD amount of whole cents/ ],
	[ 'a ceiling without an issuer token', { '--issuer-max-period-usd' => '100' },
	  qr/--issuer-max-period-usd is for --issuer-token-file, which is not given/ ],
	[ 'a header deadline of 0', { '--header-timeout' => '0' }, qr/--header-timeout must be an integer 1\.\.3600, got "0"/ ],
	[ 'a body deadline that is not a number', { '--body-timeout' => '5s' }, qr/--body-timeout must be an integer 1\.\.3600/ ],
	[ 'an idle deadline past an hour', { '--idle-timeout' => '3601' }, qr/--idle-timeout must be an integer 1\.\.3600/ ],
	[ 'no connections at all', { '--max-connections' => '0' }, qr/--max-connections must be an integer 1\.\.1000000/ ],
) {
	my ($what, $changes, $message) = @$case;
	my ($exit, $err, $line) = refused(%$changes);
	is($exit, 2, "$what: a usage error (exit 2)");
	like($err, $message, "$what: it says why") or diag($err);
	is($line, undef, "$what: it never listened");
}

my @cases = (
	[ 'a missing key file', { '--upstream-key-file' => "$dir/none" }, qr/cannot read --upstream-key-file \S+: No such file/ ],
	[ 'a key file readable by others', { '--upstream-key-file' => write_secret_file("$dir/open.key", 'sk_test_abcdefgh', 0644) },
	  qr/--upstream-key-file \S+ has group or world access \(mode 0644\)/ ],
	[ 'a key file without a Stripe key', { '--upstream-key-file' => write_secret_file("$dir/bad.key", 'hello') },
	  qr/does not hold a Stripe key/ ],
	[ 'an unreadable admin token file', { '--admin-token-file' => "$dir/none.token" }, qr/cannot read --admin-token-file/ ],
	[ 'a group-readable token file', { '--admin-token-file' => write_secret_file("$dir/g.token", 'b' x 40, 0640) },
	  qr/--admin-token-file \S+ has group or world access \(mode 0640\)/ ],
	[ 'a short token', { '--issuer-token-file' => write_secret_file("$dir/short.token", 'abc'),
		'--issuer-max-period-usd' => '100' },
	  qr/--issuer-token-file \S+ holds fewer than 24 characters/ ],
	[ 'plain http to another host', { '--upstream' => 'http://example.com' }, qr/--upstream http:\/\/example.com is refused. The URL must be an https:\/\// ],
	[ 'an unreachable database', { '--database' => 'host=/nonexistent dbname=postgres' }, qr/cannot reach the --database/ ],
);
$node->q1('CREATE DATABASE plain');
push @cases, [ 'a database without the extension', { '--database' => $node->connstr('plain') },
	qr/database plain lacks the billguard extension: CREATE EXTENSION billguard/ ];
$node->q1('CREATE DATABASE old');
$node->safe_psql('old', "CREATE EXTENSION billguard VERSION '0.1.0'");
push @cases, [ 'a database at billguard 0.1.0', { '--database' => $node->connstr('old') },
	qr/database old has billguard 0.1.0 without the spend-cap ledger: ALTER EXTENSION billguard UPDATE/ ];
$node->q1('CREATE ROLE nobody_proxy LOGIN');
push @cases, [ 'a role without the grants', { '--database' => $node->connstr('postgres') . ' user=nobody_proxy' },
	qr/role nobody_proxy may not use schema billguard in database postgres/ ];
for my $case (@cases) {
	my ($what, $changes, $message) = @$case;
	my ($exit, $err, $line) = refused(%$changes);
	is($exit, 1, "$what: the proxy refuses to start (exit 1)");
	like($err, qr/\A billguard-proxy: .*\n\z/x, "$what: one line on stderr") or diag($err);
	like($err, $message, "$what: it says why");
	is($line, undef, "$what: it never listened");
}

# ---- the grants of docs/privileges.md, as written -----------------------------------------------

my ($proxy_grants) = slurp_file("$ENV{BILLGUARD_ROOT}/docs/privileges.md")
  =~ /^## The proxy's role\n.*?^```sql\n(.*?)^```\n/ms;
like($proxy_grants // '', qr/\ACREATE ROLE billguard_proxy LOGIN;\n.*TO billguard_proxy;\n\z/s,
	"docs/privileges.md holds the proxy's role and its grants");
$node->q1($proxy_grants);
my $proxy = ProxyHarness->start(conninfo => $node->connstr('postgres') . ' user=billguard_proxy', upstream => $emulator);
my $vault = $proxy->issue_key(billing_period => '2026-08', period_usd_cap => 1);
is($proxy->charge($vault->{vault_key}, 'role-1', amount => 60)->{status}, 200, 'as billguard_proxy, a charge passes');
is($proxy->charge($vault->{vault_key}, 'role-2', amount => 60)->{status}, 429, '... and the cap holds');
is($proxy->request('POST', "/keys/$vault->{key_id}", '{"period_usd_cap": 2}', token => $proxy->admin_token,
	content_type => 'application/json')->{status}, 200, '... an admin raises the cap');
is($proxy->request('DELETE', "/keys/$vault->{key_id}", undef, token => $proxy->admin_token)->{status}, 200,
	'... and revokes the key');
like($proxy->request('GET', '/metrics', undef)->{content}, qr/billguard_proxy_budget_cap_cents\{[^}]*\} 200/,
	'... and /metrics reads the budgets');
my $as_proxy = $node->connstr('postgres') . ' user=billguard_proxy';
for my $sql ('UPDATE billguard.vault_budgets SET cap_cents = 999999',
	'SELECT * FROM billguard.vault_keys', "DELETE FROM billguard.vault_reservations",
	'SELECT * FROM billguard.billing_records', "SELECT * FROM billguard.bill_period('2026-08')") {
	my ($out, $err) = run_command([ 'psql', '-XAtq', '-d', $as_proxy, '-c', $sql ]);
	like($err, qr/permission denied/, "billguard_proxy cannot: $sql");
}
is($node->q1(q{SELECT cap_cents FROM billguard.vault_budgets WHERE billing_period = '2026-08'}), '200',
	'the cap is what the admin set, nothing more');

$proxy->stop;
$emulator->stop;
$node->stop;
done_testing();

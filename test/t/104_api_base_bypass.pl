# billguard.api_base cannot be made to send the API key in clear text to a
# host that is not loopback. libcurl connects to the host
# after an '@', so 'http://127.0.0.1:80@evil.example' looked like loopback to
# a check that read the text before the first ':' and was accepted.
#   - ALTER SYSTEM SET with that value, and with other spellings libcurl
#     would read differently (a number for 127.0.0.1, hexadecimal, an IPv6
#     zone id, percent-encoding), is refused with SQLSTATE 22023 and the
#     reason, and postgresql.auto.conf is left as it was;
#   - the same value written into postgresql.conf and reloaded is refused:
#     the old value stays in force, and billing still goes there.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardTest;
use BillguardNode;

my $emulator = start_emulator();
my $node = BillguardNode->dispatching('api_base', $emulator);
my $good = $emulator->url('');
my $auto_conf = $node->data_dir . '/postgresql.auto.conf';
my $auto_before = slurp_file($auto_conf);

my %bypasses = (
	'http://127.0.0.1:80@evil.example' => qr/must not contain a user name, password or login options/,
	'http://127.0.0.1@evil.example' => qr/must not contain a user name, password or login options/,
	'http://2130706433:80' => qr/must be written as libcurl writes it: http:\/\/127\.0\.0\.1:80/,
	'http://0x7f.1' => qr/must be written as libcurl writes it/,
	'http://%31%32%37.0.0.1' => qr/must be written as libcurl writes it/,
	'http://[::1%25eth0]:80' => qr/must not contain an IPv6 zone id/,
	'http://localhost.' => qr/http:\/\/ to a loopback host/);
for my $value (sort keys %bypasses) {
	my ($rc, $out, $err) = $node->psql('postgres',
		"\\set VERBOSITY verbose\nALTER SYSTEM SET billguard.api_base = '$value'");
	like($err, qr/ERROR:  22023: invalid value for parameter "billguard.api_base": "\Q$value\E"/,
		"ALTER SYSTEM SET billguard.api_base = '$value' is refused with SQLSTATE 22023");
	like($err, $bypasses{$value}, "... and the detail says why");
}
is(slurp_file($auto_conf), $auto_before, 'postgresql.auto.conf is unchanged');
is($node->q1('SHOW billguard.api_base'), $good, 'billguard.api_base is still the emulator');

# The same value in postgresql.conf: a reload refuses it and keeps the old one.
my $log_offset = -s $node->logfile;
$node->append_conf('postgresql.conf', "billguard.api_base = 'http://127.0.0.1:80\@evil.example'");
$node->reload;
ok(wait_until('the reload to refuse the value', 20, sub {
	slurp_file($node->logfile, $log_offset) =~ /invalid value for parameter "billguard.api_base"/ }),
	'a reload with the bypass in postgresql.conf logs that the value is invalid');
is($node->q1('SHOW billguard.api_base'), $good, 'after the reload billguard.api_base is the old value');

$node->q1(q{INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
            VALUES ('cust_104', 'cus_104', 4900, 'usd', 'pm_card_visa')});
is($node->bill('cust_104', '2026-08'), 'initiated', 'a billing after the refused reload');
ok($node->wait_until_settled('2026-08'), 'it settles');
is($node->status_of('cust_104', '2026-08'), 'completed', 'it is completed');
is(scalar(@{ succeeded_for_key($emulator, $node->key_of('cust_104', '2026-08')) }), 1,
	'the charge went to the emulator, the old api_base, once');

$node->stop;
$emulator->stop;
done_testing();

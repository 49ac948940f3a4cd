# The API key file must be readable by the server's user only, so no other
# local user can read the Stripe key, as libpq requires of ~/.pgpass: a key file with group or world access
# is refused. The dispatcher pauses and says why in dispatch_status (without
# the key), sends nothing, and resumes after chmod 600 and a reload.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);
use BillguardTest;
use BillguardNode;

my $emulator = start_emulator();
my $node = BillguardNode->dispatching('api_key_mode', $emulator);
my $key = $StripeEmulatorHarness::DEFAULT_API_KEY;
my $key_file = $node->q1('SHOW billguard.api_key_file');
$node->q1(q{INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
            VALUES ('cust_105', 'cus_105', 4900, 'usd', 'pm_card_visa')});

# Group-readable from the start: refused when the dispatcher starts.
chmod 0640, $key_file or die "chmod $key_file: $!";
$node->restart;
ok(wait_until('the dispatcher to pause', 20, sub { $node->q1('SELECT paused FROM billguard.dispatch_status') eq 't' }),
	'a group-readable key file: the dispatcher is paused');
my $reason = $node->q1('SELECT pause_reason FROM billguard.dispatch_status');
like($reason, qr/billguard\.api_key_file has group or world access \(mode 0640\).*chmod 600/,
	'dispatch_status says the file has group access and what to do');
unlike($reason, qr/\Q$key\E/, 'the reason does not contain the key');
unlike($reason, qr/\Q$key_file\E/, 'nor the path of the key file (superuser-only)');

is($node->bill('cust_105', '2026-08'), 'initiated', 'a billing while paused');
sleep 1;    # several poll intervals: a dispatcher that sends would have sent by now
is($emulator->stats->{requests} // 0, 0, 'nothing reaches the emulator');
is($node->status_of('cust_105', '2026-08'), 'pending', 'the record stays pending, never claimed');

# World-readable, on reload.
chmod 0604, $key_file or die "chmod $key_file: $!";
$node->reload;
ok(wait_until('the new reason', 20, sub { $node->q1('SELECT pause_reason FROM billguard.dispatch_status') =~ /mode 0604/ }),
	'a world-readable key file after a reload: still paused, with the new mode in the reason');

# Fixed: chmod 600 and a reload resume billing.
chmod 0600, $key_file or die "chmod $key_file: $!";
$node->reload;
ok($node->wait_until_settled('2026-08'), 'after chmod 600 and a reload the record settles');
is($node->status_of('cust_105', '2026-08'), 'completed', 'it is completed');
is(scalar(@{ succeeded_for_key($emulator, $node->key_of('cust_105', '2026-08')) }), 1, 'one charge at the emulator');
is($node->q1("SELECT paused::text || '|' || coalesce(pause_reason, '') FROM billguard.dispatch_status"), 'false|',
	'dispatch_status: no longer paused');

$node->stop;
unlike(slurp_file($node->logfile), qr/\Q$key\E/, 'the key never appears in the server log');
$emulator->stop;
done_testing();

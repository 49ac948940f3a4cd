# Asking the proxy for a period's vault key never stalls the charges already
# in flight. A front that forwards everything to a real billguard-proxy holds
# the answer to POST /keys for 2026-09 for several seconds, while the charges
# of 2026-08 are at the Stripe emulator (2 s latency):
#   - the 2026-08 charges in flight when the key is asked for are answered,
#     recorded and completed before the key's answer arrives;
#   - a 2026-08 record billed while the key is outstanding is sent and
#     completed before it arrives too: the records waiting for a key hold
#     back no other period's;
#   - once it arrives, 2026-09 is billed with that key: one POST /keys per
#     period, never a second one while the first is outstanding.
use strict;
use warnings;
use File::Temp qw(tempdir);
use HTTP::Tiny;
use JSON::PP;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);
use BillguardTest;
use BillguardNode;
use SecretFile qw(write_secret_file);
use ProxyHarness;
use RawHttpServer;

# Long enough that a charge answered after 2 s and recorded is plainly
# earlier, on a loaded machine too.
my $key_delay_s = 10;

my $emulator = start_emulator();
my $node = BillguardNode->preloaded('key_fetch_never_stalls',
	"billguard.database = 'postgres'",
	"billguard.max_requests_per_second = 2000",
	"billguard.max_inflight = 32",
	"billguard.poll_interval = '200ms'",
	"billguard.request_timeout = '30s'");
my $proxy = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator);

# The front: POST /keys for 2026-09 waits $key_delay_s before it is
# forwarded; the moments it was asked and answered are files in $marks.
my $marks = tempdir(CLEANUP => 1);
my $front = RawHttpServer->start(sub {
	my ($head, $body) = @_;
	my ($method, $path) = $head =~ m{^(\S+) (\S+)};
	my %headers;
	for my $line (split /\r\n/, $head) {
		my ($name, $value) = $line =~ /^([^:\s]+):\s*(.*)$/ or next;
		next if $name =~ /^(host|content-length|connection|expect)$/i;
		$headers{$name} = $value;
	}
	my $slow_key = $method eq 'POST' && $path eq '/keys' && $body =~ /"billing_period"\s*:\s*"2026-09"/;
	if ($method eq 'POST' && $path eq '/keys') {
		open my $fh, '>>', "$marks/keys_asked" or die;
		print $fh (($body =~ /"billing_period"\s*:\s*"([^"]+)"/)[0] // '?'), "\n";
		close $fh;
	}
	sleep $key_delay_s if $slow_key;
	my $r = HTTP::Tiny->new(timeout => 60)->request($method, $proxy->url($path),
		{ headers => \%headers, (length $body ? (content => $body) : ()) });
	if ($slow_key) {
		open my $fh, '>', "$marks/key_answered" or die;
		close $fh;
	}
	return ($r->{status}, $r->{content} // '', $r->{headers}{'request-id'} // '');
});
sub key_answered { return -e "$marks/key_answered" }
sub keys_asked {
	open my $fh, '<', "$marks/keys_asked" or return '';
	return join ',', map { chomp; $_ } <$fh>;
}
sub completed {
	my ($period) = @_;
	return $node->q1("SELECT count(*) FROM billguard.billing_records WHERE billing_period = '$period' AND status = 'completed'");
}

my $token_file = write_secret_file($node->basedir . '/issuer.token', $proxy->issuer_token);
$node->q1(q{
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
	SELECT 'cust_' || lpad(g::text, 6, '0'), 'cus_' || lpad(g::text, 6, '0'), 1000 + g, 'usd', 'pm_card_visa'
	  FROM generate_series(1, 10) g});
$node->reload_with(api_base => $front->url(''), vault_issuer_token_file => $token_file);
# 2026-08's key comes at once; its charges then take 2 s at the emulator.
$emulator->configure(latency_ms => 2000);
is($node->q1("SELECT initiated FROM billguard.bill_period('2026-08')"), '10', '2026-08 claimed');
ok(wait_until('the 2026-08 charges to be at the emulator', 30, sub { ($emulator->stats->{in_progress} // 0) == 10 }),
	'the ten 2026-08 charges are in flight at the emulator');

my $asked_at = time;
is($node->q1("SELECT initiated FROM billguard.bill_period('2026-09')"), '10', '2026-09 claimed');
ok(wait_until('the dispatcher to ask for the 2026-09 key', 10, sub { keys_asked() eq '2026-08,2026-09' }),
	"the dispatcher asks for 2026-09's key while 2026-08's charges are in flight");
ok(!key_answered(), '... and the front holds the answer');

# While the key is outstanding.
my $stalled_for = wait_until("2026-08 recorded completed, or the key answered", $key_delay_s, sub { completed('2026-08') eq '10' || key_answered() }) ? 1 : undef;
my $completed_before_key = completed('2026-08');
my $answered = key_answered();
is("$completed_before_key/" . ($answered ? 'answered' : 'outstanding'), '10/outstanding',
	'every 2026-08 charge in flight is recorded completed while the key is outstanding');
diag(sprintf('2026-08 completed %.1f s after 2026-09 was billed', time - $asked_at)) if defined $stalled_for;
is(scalar(grep { ($_->{metadata}{billguard_key} // '') ne '' } @{ succeeded_charges($emulator) }), 10,
	'... each one charge at the emulator');

$node->q1(q{
	INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
	VALUES ('cust_late', 'cus_late', 1000, 'usd', 'pm_card_visa')});
is($node->bill('cust_late', '2026-08'), 'initiated', 'a 2026-08 record billed while the key is outstanding');
wait_until("cust_late recorded completed, or the key answered", $key_delay_s, sub { $node->status_of('cust_late', '2026-08') eq 'completed' || key_answered() });
my $late = $node->status_of('cust_late', '2026-08');
$answered = key_answered();
is("$late/" . ($answered ? 'answered' : 'outstanding'), 'completed/outstanding',
	'... is sent and completed before the key answer arrives');
is(completed('2026-09'), '0', 'no 2026-09 record was sent without its key');

ok($node->wait_until_settled('2026-09', 60), 'once the key arrives, 2026-09 is billed');
is(completed('2026-09'), '10', '... every record completed');
is(keys_asked(), '2026-08,2026-09', 'one POST /keys per period, none repeated while one was outstanding');
is($node->q1("SELECT count(*) FROM billguard.vault_audit WHERE decision = 'issued'"), '2', '... two keys issued');
my $key_id = $node->q1("SELECT key_id FROM billguard.vault_credentials WHERE billing_period = '2026-09'");
is($node->q1(qq{SELECT count(*) FROM billguard.vault_audit
                 WHERE key_id = '$key_id' AND decision IN ('reserved', 'forwarded')}) > 0 ? 'used' : 'unused',
	'used', "2026-09 was sent with its key");
is(scalar(@{ succeeded_charges($emulator) }), 21, '21 charges at the emulator in all');

$front->stop;
$proxy->stop;
$node->stop;
$emulator->stop;
done_testing();

# Answers no Stripe would send, relayed by the proxy from a raw HTTP server
# standing in for Stripe: 4 MiB of nested arrays (eight at once), a number
# no double holds (1e1000000), bytes that are not UTF-8. The proxy reads of
# an answer only the id and the error type it settles with, in bounded
# memory: it never builds the answer's tree. Each answer is relayed with
# Stripe's status, settled or released as its status says, and the proxy
# neither dies nor grows by the size of the trees it would have built
# (its peak resident memory stays under 150 MiB where eight trees of a
# million nested arrays take some 650 MiB). A body that is not UTF-8 is
# relayed and kept with U+FFFD for each byte that is not (PostgreSQL's text
# takes nothing else), so a decline is released and a success settled and
# replayed from the ledger as it was first answered.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use BillguardNode;
use RawHttpServer;
use ProxyHarness;

# Idempotency-Key prefix => [status, body].
my %answers = (
	deep   => [200, '[' x (4 << 20)],
	number => [200, '{"id":"pi_number","object":"payment_intent","status":"succeeded","amount":1e1000000}'],
	utf8   => [402, qq({"error":{"type":"card_error","code":"card_declined","message":"d\xff\xfe"}})],
	latin  => [200, qq({"id":"pi_latin","object":"payment_intent","status":"succeeded","description":"caf\xe9\x00"})],
	fine   => [200, '{"id":"pi_fine","object":"payment_intent","status":"succeeded"}'],
);

sub peak_resident_kib {
	my ($pid) = @_;
	my ($kib) = slurp_file("/proc/$pid/status") =~ /^VmHWM:\s*(\d+) kB/m;
	return $kib;
}

# Stripe's stand-in answers by the Idempotency-Key's prefix.
my $stripe = RawHttpServer->start(sub {
	my ($head) = @_;
	my ($prefix) = $head =~ /^idempotency-key:\s*([a-z0-9]+)-/mi;
	return (@{ $answers{ $prefix // '' } // [404, '{}'] }, 'req_hostile');
});
my $node = BillguardNode->preloaded('proxy_hostile');
my $proxy = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $stripe->url(''));
my $key = $proxy->issue_key(billing_period => '2026-08', period_usd_cap => 1000);
my $pid = $proxy->pid;
my $idle_kib = peak_resident_kib($pid);

my @deep = $proxy->concurrently(map {
	{ method => 'POST', path => '/v1/payment_intents', body => ProxyHarness::charge_body(amount => 100),
	  vault_key => $key->{vault_key}, idempotency_key => "deep-$_" }
} 1 .. 8);
is(join(' ', map { $_->{status} // 'none' } @deep), join(' ', (200) x 8),
	'eight answers of nested arrays at once are each relayed with Stripe\'s 200');
my $peak_kib = peak_resident_kib($pid);
note("the proxy's peak resident memory: $idle_kib KiB idle, $peak_kib KiB after the nested arrays");
cmp_ok($peak_kib, '<', 150 * 1024, '... and the proxy never held their trees (peak resident memory under 150 MiB)');

my $number = $proxy->charge($key->{vault_key}, 'number-1', amount => 100);
is($number->{status}, 200, 'an answer holding 1e1000000 is relayed with its 200');
my $utf8 = $proxy->charge($key->{vault_key}, 'utf8-1', amount => 100);
is($utf8->{status}, 402, 'a decline that is not UTF-8 is relayed with its 402');
is($utf8->{content}, qq({"error":{"type":"card_error","code":"card_declined","message":"d\xef\xbf\xbd\xef\xbf\xbd"}}),
	'... each byte that is not UTF-8 as U+FFFD');
my $latin = $proxy->charge($key->{vault_key}, 'latin-1', amount => 100);
is($latin->{status}, 200, 'a success that is not UTF-8 is relayed with its 200');
my $forwarded = $stripe->requests;
my $repeat = $proxy->charge($key->{vault_key}, 'latin-1', amount => 100);
is(($repeat->{headers}{'idempotent-replayed'} // '') . ' ' . $stripe->requests, "true $forwarded",
	'... and a repeat of its Idempotency-Key is replayed from the ledger, not forwarded');
is($repeat->{content}, $latin->{content}, '... with the bytes of the first answer');
my $fine = $proxy->charge($key->{vault_key}, 'fine-1', amount => 100);
is($fine->{json}{id}, 'pi_fine', 'a well-formed answer after them is relayed as it came');

is($proxy->pid, $pid, 'the same proxy process answered every request');
is($proxy->request('GET', '/healthz', undef)->{status}, 200, '... and is healthy');
is($node->q1(q{SELECT string_agg(idempotency_key || ' ' || status || ' ' || coalesce(charge_id, '-'), ', '
	ORDER BY idempotency_key) FROM billguard.vault_reservations WHERE idempotency_key !~ '^deep'}),
	'fine-1 settled pi_fine, latin-1 settled -, number-1 settled -, utf8-1 released -',
	'each answer is settled or released by its status, with the id of a readable success');
is($node->q1(q{SELECT count(*) FILTER (WHERE status = 'settled') || '/' || count(*) FROM billguard.vault_reservations
	WHERE idempotency_key ~ '^deep'}), '8/8', 'the successes of nested arrays are settled');
my $status = $proxy->key_status($key->{key_id});
is("$status->{settled_cents}/$status->{reserved_cents}", '1100/0', 'the budget counts the eleven successes, nothing reserved');

$proxy->stop;
$stripe->stop;
$node->stop;
done_testing();

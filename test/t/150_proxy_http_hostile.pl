# The proxy's HTTP layer against a hostile client, over raw sockets, with a
# real database and the emulator (or a raw server standing in for Stripe,
# to see every byte the proxy sends it):
#   - header values are never decoded: %0D%0A in Stripe-Version or
#     Idempotency-Key never becomes a line of its own upstream (five
#     concurrent requests sharing one ledger key never reach Stripe under
#     five keys), "%20" is a key of three characters, not a blank one, and
#     a token file holding %2F works as written;
#   - a CR, LF, NUL, tab or other control character in a value, a folded
#     line, a second Idempotency-Key, Stripe-Version, Content-Length,
#     Transfer-Encoding or Authorization: 400, Stripe-shaped, nothing
#     forwarded;
#   - limits on header lines, header bytes and body bytes, chunked or not;
#     200 MB of headers or of a chunked body cost no memory; a body with a
#     Content-Encoding (360 bytes of gzip that inflate past 64 KiB) is 415;
#   - framing: only Transfer-Encoding: chunked in HTTP/1.1 (%63hunked, a
#     list, HTTP/1.0: 400); pipelined requests each get their answer, in
#     order, and a body is never read as a request; keep-alive and close
#     exactly as asked;
#   - a 9.5 KB form charge with 20 metadata values passes;
#   - what reaches Stripe is the proxy's allowlist: its key, Content-Type,
#     a checked Idempotency-Key (1-255 printable ASCII, required on every
#     POST that can move money) and Stripe-Version (a version's shape);
#     a Stripe-Account of a bad shape, or of an account the key's budget
#     does not name, and Stripe-Context are refused, never dropped;
#   - 1,000 idle and trickling connections held open while /healthz and
#     charges are timed: they add at most a few milliseconds, the proxy's
#     thread count does not move, and the trickling ones get 408 at the
#     header and body deadlines; --max-connections bounds them, and so
#     does the descriptor limit, less what the proxy's own connections need.
use strict;
use warnings;
use IO::Compress::Gzip qw(gzip);
use IO::Poll qw(POLLIN POLLHUP POLLERR);
use IO::Select;
use JSON::PP;
use POSIX ();
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep time);
use BillguardTest;
use BillguardNode;
use ProxyHarness;
use RawHttpServer;

$SIG{PIPE} = 'IGNORE';

my $node = BillguardNode->preloaded('proxy_http_hostile');
my $emulator = start_emulator();
my $proxy = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator,
	args => [ '--webhook-database', $node->connstr('postgres') ]);
my $forwarded = sub { $emulator->stats->{requests} // 0 };
my $charges = sub { scalar @{ succeeded_charges($emulator) } };

# ---- raw HTTP ---------------------------------------------------------------------------------

# A request exactly as given: the header lines verbatim, Content-Length
# added unless the lines frame the body themselves.
sub http_text {
	my (%o) = @_;
	my $body = $o{body} // '';
	my @lines = ('Host: 127.0.0.1', @{ $o{lines} // [] });
	push @lines, 'Content-Length: ' . length($body)
	  unless $o{framed} || grep { /^(content-length|transfer-encoding):/i } @lines;
	return ($o{method} // 'POST') . ' ' . ($o{path} // '/v1/payment_intents') . ' ' . ($o{version} // 'HTTP/1.1')
	  . "\r\n" . join('', map { "$_\r\n" } @lines) . "\r\n" . $body;
}

# The lines of a charge with a vault key; more lines after them.
sub charge_lines {
	my ($vault_key, $idempotency_key, @more) = @_;
	return [ "Authorization: Bearer $vault_key", 'Content-Type: application/x-www-form-urlencoded',
		(defined $idempotency_key ? "Idempotency-Key: $idempotency_key" : ()), @more ];
}

sub write_all {
	my ($socket, $text) = @_;
	while (length $text) {
		my $written = syswrite($socket, $text) // return 0;
		substr($text, 0, $written) = '';
	}
	return 1;
}

# Sends the text on a new connection; returns the first answer.
sub exchange {
	my ($text, $seconds) = @_;
	my $socket = $proxy->connect_raw;
	write_all($socket, $text);
	my $answer = StripeEmulatorHarness::read_response($socket, $seconds // 10);
	close $socket;
	return $answer;
}

# Every text on its own connection, all written before any answer is read.
sub at_once {
	my (@texts) = @_;
	my @sockets = map { $proxy->connect_raw } @texts;
	write_all($sockets[$_], $texts[$_]) for 0 .. $#texts;
	return map { my $a = StripeEmulatorHarness::read_response($_, 30); close $_; $a } @sockets;
}

# A Stripe-shaped refusal with this status.
sub refused {
	my ($answer, $status) = @_;
	return ($answer->{status} // 0) == $status && ($answer->{json}{error}{type} // '') eq 'invalid_request_error'
	  && length($answer->{json}{error}{message} // '') > 0;
}
sub shown { my ($a) = @_; return $a->{status} ? "$a->{status} " . ($a->{json}{error}{code} // '') : ($a->{timed_out} ? 'no answer' : 'closed') }

# ---- the bytes that reach Stripe -----------------------------------------------------------------

# A stand-in for Stripe that keeps the head of every request it is sent.
my $heads_file = "$PostgreSQL::Test::Utils::tmp_check/upstream_heads.txt";
my $counter = 0;
my $stripe = RawHttpServer->start(sub {
	my ($head) = @_;
	open my $log, '>>', $heads_file or die "$heads_file: $!";
	print $log "$head\n=====\n";
	close $log;
	my $id = 'capture_' . $$ . '_' . ++$counter;
	return (200, qq({"id":"pi_$id","object":"payment_intent","status":"succeeded","amount":100}), "req_$id");
});
my $capture = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $stripe->url(''));
my $capture_key = $capture->issue_key(billing_period => '2031-01', period_usd_cap => 1000);
sub upstream_heads { open my $fh, '<', $heads_file or return (); local $/; return split /\n=====\n/, <$fh> }
sub capture_send {
	my ($text) = @_;
	my $socket = $capture->connect_raw;
	write_all($socket, $text);
	my $answer = StripeEmulatorHarness::read_response($socket, 10);
	close $socket;
	return $answer;
}

# ---- 1. %0D%0A in a header value stays in it --------------------------------------------------

my $r = capture_send(http_text(body => ProxyHarness::charge_body(amount => 100),
	lines => charge_lines($capture_key->{vault_key}, 'inject-1', 'Stripe-Version: 2024-06-20%0D%0AStripe-Account:%20acct_x')));
ok(refused($r, 400), "Stripe-Version: 2024-06-20%0D%0AStripe-Account:%20acct_x is 400 (got " . shown($r) . ')');
$r = capture_send(http_text(body => ProxyHarness::charge_body(amount => 100),
	lines => charge_lines($capture_key->{vault_key}, 'inject-2%0D%0AStripe-Account:%20acct_x')));
is($r->{status}, 200, 'Idempotency-Key: inject-2%0D%0AStripe-Account:%20acct_x is a key like any other');
my @heads = upstream_heads();
is(scalar(grep { /^Stripe-Account:/mi } @heads), 0, '... and no Stripe-Account line ever reached Stripe');
is(scalar(grep { /^Idempotency-Key: inject-2%0D%0AStripe-Account:%20acct_x\r?$/mi } @heads), 1,
	'... the key reached it as sent, undecoded');
like($heads[-1] // '', qr/^Authorization: Bearer \Q$StripeEmulatorHarness::DEFAULT_API_KEY\E\r?$/mi,
	'... beside the real key');

my $cap1 = $proxy->issue_key(billing_period => '2031-02', period_usd_cap => 1);
my $before = $charges->();
my @five = at_once(map { http_text(body => ProxyHarness::charge_body(amount => 100, customer => 'cus_inject'),
	lines => charge_lines($cap1->{vault_key}, 'one-ledger-key', "Stripe-Version: 2022-11-15%0D%0AIdempotency-Key:%20S$_")) } 1 .. 5);
is(join(' ', map { $_->{status} // 'none' } @five), '400 400 400 400 400',
	'five concurrent charges sharing one ledger key with %0D%0AIdempotency-Key:%20S<i> in Stripe-Version: each 400');
my $status = $proxy->key_status($cap1->{key_id});
is($charges->() - $before, ($status->{settled_cents} + $status->{reserved_cents}) / 100,
	'... and Stripe charged exactly what the ledger counts');
cmp_ok($charges->() - $before, '<=', 1, '... never more than the 1 USD cap holds');

# ---- 2. "%20" is not a blank key; a blank one is refused ---------------------------------------

my $one = $proxy->issue_key(billing_period => '2031-03', period_usd_cap => 1);
$before = $charges->();
my @blank = at_once(map { http_text(body => ProxyHarness::charge_body(amount => 100, customer => 'cus_blank'),
	lines => charge_lines($one->{vault_key}, '%20')) } 1 .. 5);
is($charges->() - $before, 1, 'Idempotency-Key: %20 sent five times at once: one charge through a one-charge cap');
ok(!grep({ ($_->{status} // 0) != 200 && ($_->{status} // 0) != 409 } @blank),
	'... each answer the charge or Stripe\'s 409 key in use');
is(scalar(grep { ($_->{idempotency_key} // '') eq '%20' } @{ succeeded_charges($emulator) }), 1,
	'... made under the key as sent');
my $at_stripe = $forwarded->();
for my $case ([ 'spaces only', 'Idempotency-Key:    ' ], [ 'empty', 'Idempotency-Key:' ],
	[ 'a tab only', "Idempotency-Key: \t" ], [ '256 characters', 'Idempotency-Key: ' . ('k' x 256) ],
	[ 'bytes that are not ASCII', "Idempotency-Key: caf\xc3\xa9" ]) {
	my ($what, $line) = @$case;
	my $answer = exchange(http_text(body => ProxyHarness::charge_body(amount => 100),
		lines => [ @{ charge_lines($one->{vault_key}, undef) }, $line ]));
	ok(refused($answer, 400), "an Idempotency-Key of $what is 400 (got " . shown($answer) . ')');
}
is($forwarded->(), $at_stripe, '... and none reached Stripe');

# ---- header lines the proxy refuses ---------------------------------------------------------------

my $scope = $proxy->issue_key(billing_period => '2031-04', period_usd_cap => 1000);
my $body = ProxyHarness::charge_body(amount => 100);
my $length = length $body;
my @bad_lines = (
	[ 'a bare CR in a value', "Stripe-Version: 2024-06-20\rStripe-Account: acct_x" ],
	[ 'a bare LF in a value', "Stripe-Version: 2024-06-20\nStripe-Account: acct_x" ],
	[ 'a NUL in a value', "X-Note: a\0b" ],
	[ 'a tab inside a value', "X-Note: a\tb" ],
	[ 'another control character (0x01)', "X-Note: a\x01b" ],
	[ 'DEL in a value', "X-Note: a\x7fb" ],
	[ 'a folded line (space)', "X-Note: a\r\n b" ],
	[ 'a folded Stripe-Version (tab)', "Stripe-Version: 2024-06-20\r\n\tStripe-Account: acct_x" ],
	[ 'a second Idempotency-Key', 'Idempotency-Key: second' ],
	[ 'a second Stripe-Version', "Stripe-Version: 2024-06-20\r\nStripe-Version: 2022-11-15" ],
	[ 'a second Content-Length of the same value', "Content-Length: $length\r\nContent-Length: $length" ],
	[ 'a second Transfer-Encoding', "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked" ],
	[ 'a second Authorization', "Authorization: Bearer $scope->{vault_key}" ],
);
$at_stripe = $forwarded->();
for my $i (0 .. $#bad_lines) {
	my ($what, $line) = @{ $bad_lines[$i] };
	my $chunked = $line =~ /Transfer-Encoding/;
	my $answer = exchange(http_text(body => $chunked ? sprintf("%x\r\n%s\r\n0\r\n\r\n", $length, $body) : $body,
		lines => [ @{ charge_lines($scope->{vault_key}, "bad-line-$i") }, $line ]));
	ok(refused($answer, 400), "$what: 400, Stripe-shaped (got " . shown($answer) . ')');
}
is($forwarded->(), $at_stripe, '... and none of them reached Stripe');
is($proxy->key_status($scope->{key_id})->{reserved_cents}, 0, '... nor was counted');

# ---- limits -------------------------------------------------------------------------------------

$at_stripe = $forwarded->();
$r = exchange(http_text(body => $body, lines => [ @{ charge_lines($scope->{vault_key}, 'many-lines') },
	map { "X-Line-$_: 1" } 1 .. 100 ]));
ok(refused($r, 431), '100 header lines (2 KB): 431 (got ' . shown($r) . ')');
$r = exchange(http_text(body => $body, lines => [ @{ charge_lines($scope->{vault_key}, 'big-line') }, 'X-Big: ' . ('b' x 9000) ]));
ok(refused($r, 431), 'a 9 KB header line: 431 (got ' . shown($r) . ')');
$r = exchange(http_text(body => ProxyHarness::charge_body(amount => 100, description => 'd' x 70000),
	lines => charge_lines($scope->{vault_key}, 'big-body')));
ok(refused($r, 413), 'a 70 KB body with Content-Length: 413 (got ' . shown($r) . ')');
my $big = ProxyHarness::charge_body(amount => 100, description => 'd' x 70000);
$r = exchange(http_text(lines => [ @{ charge_lines($scope->{vault_key}, 'big-chunked') }, 'Transfer-Encoding: chunked' ],
	body => join('', map { sprintf("%x\r\n%s\r\n", length, $_) } unpack('(a4096)*', $big)) . "0\r\n\r\n"));
ok(refused($r, 413), 'a 70 KB chunked body: 413 (got ' . shown($r) . ')');
my $gzipped_charge;
gzip(\ProxyHarness::charge_body(amount => 100), \$gzipped_charge);
$r = exchange(http_text(body => $gzipped_charge,
	lines => [ @{ charge_lines($scope->{vault_key}, 'gzip-charge') }, 'Content-Encoding: gzip' ]));
ok(refused($r, 415), 'a gzip charge on /v1: 415 (got ' . shown($r) . ')');
is($forwarded->(), $at_stripe, '... none forwarded');
is(exchange(http_text(body => $body, lines => [ @{ charge_lines($scope->{vault_key}, 'identity') }, 'Content-Encoding: identity' ]))->{status},
	200, 'Content-Encoding: identity is taken');
my $swelling;
gzip(\('{"id":"evt_swell","object":"event","pad":"' . ('0' x 400000) . '"}'), \$swelling);
note('gzip webhook body: ' . length($swelling) . ' bytes on the wire');
$r = exchange(http_text(path => '/webhooks/stripe', body => $swelling,
	lines => [ 'Content-Type: application/json', 'Content-Encoding: gzip', 'Stripe-Signature: t=1,v1=00' ]));
ok(refused($r, 415), 'a gzip webhook delivery that would inflate past 64 KiB: 415 (got ' . shown($r) . ')');

# 200 MB, sent until the proxy answers or stops reading; what it cost in memory.
sub flood {
	my ($head, $piece, $megabytes) = @_;
	my $socket = $proxy->connect_raw;
	$socket->blocking(0);
	my $select = IO::Select->new($socket);
	my ($sent, $deadline, $pending) = (0, time + 60, $head);
	while ($sent < $megabytes << 20 && time < $deadline) {
		last if $select->can_read(0);
		$pending = $piece if $pending eq '';
		next unless $select->can_write(1);
		my $written = syswrite($socket, $pending);
		last if !defined $written && !$!{EAGAIN};
		next unless $written;
		substr($pending, 0, $written) = '';
		$sent += $written;
	}
	$socket->blocking(1);
	my $answer = StripeEmulatorHarness::read_response($socket, 10);
	close $socket;
	return ($answer, $sent);
}
my $rss_before = $proxy->resident_kib;
my ($flooded, $sent) = flood("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n", "X-Flood: " . ('f' x 1014) . "\r\n", 200);
my $rss_after = $proxy->resident_kib;
note(sprintf('header flood: %.1f MB sent, resident %d -> %d KiB', $sent / 1e6, $rss_before, $rss_after));
ok(refused($flooded, 431), '200 MB of header lines: 431 (got ' . shown($flooded) . ')');
cmp_ok($sent, '<', 20 << 20, '... after the proxy stopped reading long before 200 MB');
cmp_ok($rss_after - $rss_before, '<', 16 * 1024, '... and the proxy\'s resident memory grew by less than 16 MiB');
my $chunk = sprintf("%x\r\n%s\r\n", 65536, 'c' x 65536);
$rss_before = $proxy->resident_kib;
($flooded, $sent) = flood("POST /webhooks/stripe HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
	. "Stripe-Signature: t=1,v1=00\r\nTransfer-Encoding: chunked\r\n\r\n", $chunk, 200);
$rss_after = $proxy->resident_kib;
note(sprintf('chunked flood: %.1f MB sent, resident %d -> %d KiB', $sent / 1e6, $rss_before, $rss_after));
ok(refused($flooded, 413), 'a 200 MB chunked POST /webhooks/stripe: 413, never passed to the database (got ' . shown($flooded) . ')');
cmp_ok($rss_after - $rss_before, '<', 16 * 1024, '... and resident memory grew by less than 16 MiB');
is($proxy->request('GET', '/healthz', undef)->{status}, 200, 'the proxy serves on');

# ---- framing ------------------------------------------------------------------------------------

my $chunked_body = sprintf("%x\r\n%s\r\n0\r\n\r\n", $length, $body);
$at_stripe = $forwarded->();
for my $case ([ '%63hunked', 'Transfer-Encoding: %63hunked', 'HTTP/1.1' ],
	[ 'gzip, chunked', 'Transfer-Encoding: gzip, chunked', 'HTTP/1.1' ],
	[ 'chunked in HTTP/1.0', 'Transfer-Encoding: chunked', 'HTTP/1.0' ],
	[ 'chunked beside a Content-Length', "Transfer-Encoding: chunked\r\nContent-Length: " . length($chunked_body), 'HTTP/1.1' ]) {
	my ($what, $line, $version) = @$case;
	$r = exchange(http_text(version => $version, body => $chunked_body,
		lines => [ @{ charge_lines($scope->{vault_key}, "te-$what") }, $line ]));
	ok(refused($r, 400), "Transfer-Encoding $what: 400 (got " . shown($r) . ')');
}
is($forwarded->(), $at_stripe, '... none forwarded');
is(exchange(http_text(body => $chunked_body, lines => [ @{ charge_lines($scope->{vault_key}, 'te-ok') }, 'Transfer-Encoding: Chunked' ]))->{status},
	200, 'Transfer-Encoding: chunked (in any case) is taken');
my $with_extension = sprintf("%x;name=value\r\n%s\r\n0\r\n\r\n", $length, $body);
ok(refused(exchange(http_text(body => $with_extension, lines => [ @{ charge_lines($scope->{vault_key}, 'te-ext') },
	'Transfer-Encoding: chunked' ])), 400), 'a chunk extension: 400');
my $with_trailer = sprintf("%x\r\n%s\r\n0\r\nIdempotency-Key: trailer\r\n\r\n", $length, $body);
ok(refused(exchange(http_text(body => $with_trailer, lines => [ @{ charge_lines($scope->{vault_key}, 'te-trailer') },
	'Transfer-Encoding: chunked' ])), 400), 'a trailer field: 400');

# Pipelined: three at once, three answers, in order.
my $socket = $proxy->connect_raw;
write_all($socket, join('', map { http_text(method => 'GET', path => $_) } '/healthz', '/metrics', '/healthz'));
my @pipelined = map { StripeEmulatorHarness::read_response($socket, 10) } 1 .. 3;
is(join(' ', map { $_->{status} // 'none' } @pipelined), '200 200 200', 'three pipelined requests get three answers');
is(join(' ', map { ($_->{headers}{'content-type'} // '') =~ /json/ ? 'healthz' : 'metrics' } @pipelined),
	'healthz metrics healthz', '... in the order asked');
# A body that is itself a request is a body: one answer for it, never two.
my $inner = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
write_all($socket, http_text(method => 'GET', path => '/healthz')
	. http_text(body => $inner, lines => charge_lines($scope->{vault_key}, 'inner-request')));
my @two = map { StripeEmulatorHarness::read_response($socket, 3) } 1 .. 3;
is(join(' ', map { $_->{status} // ($_->{timed_out} ? 'none' : 'closed') } @two), '200 400 none',
	'a pipelined POST whose body holds a request: its own answer, and the body is never run');
is($two[1]{json}{error}{code}, 'parameter_invalid_encoding', '... the answer the POST deserves');
close $socket;

# Keep-alive exactly as asked.
$socket = $proxy->connect_raw;
write_all($socket, http_text(method => 'GET', path => '/healthz'));
StripeEmulatorHarness::read_response($socket, 5);
write_all($socket, http_text(method => 'GET', path => '/healthz', lines => [ 'Connection: close' ]));
$r = StripeEmulatorHarness::read_response($socket, 5);
is(($r->{status} // '') . ' ' . ($r->{headers}{connection} // ''), '200 close',
	'HTTP/1.1 keeps the connection; Connection: close is answered with close');
ok(StripeEmulatorHarness::read_response($socket, 5)->{closed}, '... and the connection then closes');
close $socket;
$socket = $proxy->connect_raw;
write_all($socket, http_text(method => 'GET', path => '/healthz', version => 'HTTP/1.0'));
is(StripeEmulatorHarness::read_response($socket, 5)->{status}, 200, 'HTTP/1.0 is answered');
ok(StripeEmulatorHarness::read_response($socket, 5)->{closed}, '... and closed');
close $socket;
$socket = $proxy->connect_raw;
write_all($socket, http_text(method => 'GET', path => '/healthz', version => 'HTTP/1.0', lines => [ 'Connection: keep-alive' ]));
is(StripeEmulatorHarness::read_response($socket, 5)->{headers}{connection}, 'keep-alive', 'HTTP/1.0 with keep-alive is kept');
write_all($socket, http_text(method => 'GET', path => '/healthz', version => 'HTTP/1.0', lines => [ 'Connection: keep-alive' ]));
is(StripeEmulatorHarness::read_response($socket, 5)->{status}, 200, '... and answers again');
close $socket;
# A HEAD's answer has no body: the next answer on the connection is whole.
$socket = $proxy->connect_raw;
write_all($socket, http_text(method => 'HEAD', path => '/healthz') . http_text(method => 'GET', path => '/healthz'));
my $bytes = '';
while (IO::Select->new($socket)->can_read(1)) { sysread($socket, $bytes, 65536, length $bytes) or last }
like($bytes, qr{^HTTP/1\.1 404 [^\r]*\r\n(?:[^\r]+\r\n)*\r\nHTTP/1\.1 200 [^\r]*\r\n(?:[^\r]+\r\n)*\r\n\{"status":"ok"\}$},
	'HEAD is answered without a body, and the GET after it in full');
close $socket;
# Expect: 100-continue, as curl sends it.
$socket = $proxy->connect_raw;
write_all($socket, substr(http_text(body => $body, lines => [ @{ charge_lines($scope->{vault_key}, 'expect-1') },
	'Expect: 100-continue' ]), 0, -length $body));
my $continue = '';
sysread($socket, $continue, 100) if IO::Select->new($socket)->can_read(5);
like($continue, qr{^HTTP/1\.1 100 Continue\r\n\r\n}, 'Expect: 100-continue gets 100 Continue');
write_all($socket, $body);
is(StripeEmulatorHarness::read_response($socket, 10)->{status}, 200, '... then the answer');
close $socket;

# ---- 5. large forms, tokens as written ----------------------------------------------------------------

my $form = $proxy->issue_key(billing_period => '2031-05', period_usd_cap => 10);
my $metadata = join('&', map { sprintf('metadata[field_%02d]=%s', $_, 'm' x 450) } 1 .. 20);
my $large = ProxyHarness::charge_body(amount => 100) . "&$metadata";
note('the form charge: ' . length($large) . ' bytes');
$r = $proxy->request('POST', '/v1/payment_intents', $large, vault_key => $form->{vault_key}, idempotency_key => 'large-form');
is($r->{status}, 200, 'a 9.5 KB form charge with 20 metadata values passes');
my ($large_charge) = @{ ledger_for_key($emulator, 'large-form') };
is(scalar(keys %{ $large_charge->{metadata} // {} }), 20, '... and reaches Stripe with its 20 metadata values');
my $percent = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator,
	admin_token => 'admin%2Ftoken%2Fwritten-as-is-0001');
is($percent->request_key(as => 'admin', billing_period => '2031-06')->{status}, 200,
	'a token file holding %2F works when presented as written');
$percent->stop;

# ---- what reaches Stripe: the proxy's allowlist ------------------------------------------------------

unlink $heads_file;
$r = capture_send(http_text(body => ProxyHarness::charge_body(amount => 100),
	lines => charge_lines($capture_key->{vault_key}, 'allow-1', 'Stripe-Version: 2025-03-31.basil', 'User-Agent: Stripe/v1 NodeBindings',
		'X-Stripe-Client-User-Agent: {"lang":"node"}', 'Cookie: session=1', 'X-Forwarded-For: 10.0.0.1',
		'Accept-Encoding: gzip', 'X-Custom: 1', 'Connection: keep-alive')));
is($r->{status}, 200, 'a charge with a client\'s usual headers passes');
my ($head) = upstream_heads();
my %sent = map { lc($_->[0]) => $_->[1] } map { [ /^([^:]+):\s*(.*?)\r?$/ ] } grep { /:/ } split /\n/, $head // '';
is(join(' ', sort keys %sent), 'accept authorization content-length content-type host idempotency-key stripe-version',
	'Stripe gets only the proxy\'s headers: its key, Content-Type, Idempotency-Key and Stripe-Version (and libcurl\'s own)');
is("$sent{'idempotency-key'} $sent{'stripe-version'} $sent{'content-type'}",
	'allow-1 2025-03-31.basil application/x-www-form-urlencoded', '... with the checked values');
my $upstream_requests = $stripe->requests;
for my $case ([ 'a Stripe-Version that is not a version', 'Stripe-Version: latest', 'allow-2' ],
	[ 'a Stripe-Version with a beta', 'Stripe-Version: 2022-11-15; feature_beta=v1', 'allow-3' ],
	[ 'a Stripe-Account that is not an account id', 'Stripe-Account: acct_other!', 'allow-4' ],
	[ 'Stripe-Context', 'Stripe-Context: ctx_other', 'allow-5' ]) {
	my ($what, $line, $idem) = @$case;
	$r = capture_send(http_text(body => ProxyHarness::charge_body(amount => 100), lines => charge_lines($capture_key->{vault_key}, $idem, $line)));
	ok(refused($r, 400), "$what: 400 (got " . shown($r) . ')');
}
$r = capture_send(http_text(body => ProxyHarness::charge_body(amount => 100),
	lines => charge_lines($capture_key->{vault_key}, 'allow-6', 'Stripe-Account: acct_other')));
ok(refused($r, 403) && $r->{json}{error}{code} eq 'stripe_account_not_allowed',
	'a Stripe-Account the budget does not name: 403 (got ' . shown($r) . ')');
for my $target ('/v1/payment_intents/search?query=customer:"cus_x"', '/v1/payment_intents/search?query=a%zz',
	'/v1/payment_intents?limit=1#fragment') {
	$r = capture_send(http_text(method => 'GET', path => $target, lines => [ "Authorization: Bearer $capture_key->{vault_key}" ]));
	ok(refused($r, 400), "a read of $target (what a URL must escape, a broken escape, a fragment): 400 (got " . shown($r) . ')');
}
is(capture_send(http_text(method => 'GET', path => "/v1/payment_intents/search?query=customer%3A%27cus_x%27&limit=10",
	lines => [ "Authorization: Bearer $capture_key->{vault_key}" ]))->{status}, 200, '... an escaped one is read');
$r = capture_send(http_text(body => ProxyHarness::charge_body(amount => 100), lines => charge_lines($capture_key->{vault_key}, undef)));
is(shown($r), '400 idempotency_key_required', 'a charge without Idempotency-Key: 400');
my $created = $proxy->request('POST', '/v1/payment_intents', ProxyHarness::charge_body(amount => 100, confirm => 'false'),
	vault_key => $scope->{vault_key}, idempotency_key => 'to-confirm');
$at_stripe = $forwarded->();
$r = $proxy->request('POST', "/v1/payment_intents/$created->{json}{id}/confirm", 'payment_method=pm_card_visa',
	vault_key => $scope->{vault_key});
is(($r->{status} // '') . ' ' . ($r->{json}{error}{code} // ''), '400 idempotency_key_required',
	'confirming a PaymentIntent without Idempotency-Key (it moves money without an amount): 400');
is($forwarded->(), $at_stripe, '... not forwarded');
$proxy->request('POST', "/v1/payment_intents/$created->{json}{id}/cancel", undef, vault_key => $scope->{vault_key});
is($forwarded->(), $at_stripe + 1, 'cancelling one needs no key');
is($stripe->requests, $upstream_requests + 1, 'none of the refused requests reached Stripe (the escaped read did)');
like($proxy->request('GET', '/metrics', undef)->{content}, qr/billguard_proxy_requests_total\{decision="rejected",status="431"\} [1-9]/,
	'/metrics counts what the HTTP layer refused');

# ---- 6. 1,000 idle and trickling connections ---------------------------------------------------------

# Seconds one request takes on a new connection, or 99 without an answer in 2 s.
sub timed {
	my ($text) = @_;
	my $started = time;
	my $answer = exchange($text, 2);
	return $answer->{status} ? time - $started : 99;
}
my $timed_key = $proxy->issue_key(billing_period => '2031-07', period_usd_cap => 1000);
my $n = 0;
sub one_round {
	my @healthz = map { timed(http_text(method => 'GET', path => '/healthz')) } 1 .. 15;
	my @charges = map { timed(http_text(body => ProxyHarness::charge_body(amount => 50),
		lines => charge_lines($timed_key->{vault_key}, 'timed-' . ++$n))) } 1 .. 10;
	return (\@healthz, \@charges);
}
sub median { my @s = sort { $a <=> $b } @_; return $s[$#s / 2] }
sub max_of { my @s = sort { $b <=> $a } @_; return $s[0] }
my ($quiet_healthz, $quiet_charges) = one_round();

# A child holds the connections and trickles a byte to each slow one every
# 250 ms for 14 s, noting when the proxy answered or closed which.
my $report = "$PostgreSQL::Test::Utils::tmp_check/held.json";
my %held = (idle => 500, slow_headers => 250, slow_bodies => 250);
pipe(my $ready_in, my $ready_out) or die "pipe: $!";
my $holder = fork() // die "fork: $!";
if ($holder == 0) {
	close $ready_in;
	my (%group, %seen);
	my $connect = sub { IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $proxy->port, Proto => 'tcp') };
	for my $kind (sort keys %held) {
		for (1 .. $held{$kind}) {
			my $s = $connect->() or POSIX::_exit(3);
			syswrite($s, "POST /v1/payment_intents HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ") if $kind eq 'slow_headers';
			syswrite($s, "POST /webhooks/stripe HTTP/1.1\r\nHost: 127.0.0.1\r\nStripe-Signature: t=1,v1=00\r\n"
				. "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{") if $kind eq 'slow_bodies';
			push @{ $group{$kind} }, $s;
		}
	}
	syswrite($ready_out, "ready\n");
	my $start = time;
	my %answer;    # kind => [[seconds, status]]
	while (time - $start < 14) {
		my $poll = IO::Poll->new;
		for my $kind (sort keys %group) {
			for my $s (@{ $group{$kind} }) {
				next if $seen{$s};
				syswrite($s, 'a') if $kind ne 'idle';
				$poll->mask($s => POLLIN);
			}
		}
		$poll->poll(0.25);
		for my $kind (sort keys %group) {
			for my $s (grep { !$seen{$_} && $poll->events($_) } @{ $group{$kind} }) {
				my $got = sysread($s, my $bytes, 4096);
				my ($code) = ($bytes // '') =~ m{^HTTP/1\.1 (\d{3})};
				$seen{$s} = 1;
				push @{ $answer{$kind} }, [ time - $start, $code // 'closed' ];
			}
		}
	}
	open my $out, '>', $report or POSIX::_exit(4);
	print $out encode_json(\%answer);
	close $out;
	POSIX::_exit(0);
}
close $ready_out;
my $ready = StripeEmulatorHarness::read_line_with_timeout($ready_in, 60);
is($ready, 'ready', 'a child holds 1,000 connections: 500 idle, 250 trickling headers, 250 trickling a body');
my $threads_quiet = $proxy->threads;
my $descriptors = sub { my @fds = glob('/proc/' . $proxy->pid . '/fd/*'); return scalar @fds };
ok(wait_until('the proxy to accept 1,000 connections', 10, sub { $descriptors->() >= 1000 }),
	'... all open at the proxy (' . $descriptors->() . ' descriptors)');
my ($busy_healthz, $busy_charges) = one_round();
my $threads_busy = $proxy->threads;
note(sprintf('median /healthz %.2f ms quiet, %.2f ms with 1,000 connections; charges %.2f ms and %.2f ms; slowest %.2f ms and %.2f ms',
	map { $_ * 1000 } median(@$quiet_healthz), median(@$busy_healthz), median(@$quiet_charges), median(@$busy_charges),
	max_of(@$busy_healthz), max_of(@$busy_charges)));
cmp_ok(max_of(@$busy_healthz, @$busy_charges), '<', 2, 'every /healthz and charge is answered while they are held');
cmp_ok(median(@$busy_healthz) - median(@$quiet_healthz), '<=', 0.005, '... /healthz by at most 5 ms later (median)');
cmp_ok(median(@$busy_charges) - median(@$quiet_charges), '<=', 0.005, '... a charge by at most 5 ms later (median)');
is($threads_busy, $threads_quiet, "... and the proxy's threads are the same ($threads_quiet): a connection takes none");
waitpid($holder, 0);
is($? >> 8, 0, 'the child held them for 14 s');
my $held = decode_json(slurp_file($report));
my $all_408 = sub {
	my ($kind) = @_;
	my @a = @{ $held->{$kind} // [] };
	return scalar(@a) == $held{$kind} && !grep({ $_->[1] ne '408' || $_->[0] < 8 || $_->[0] > 13 } @a);
};
ok($all_408->('slow_headers'), 'every connection trickling its headers got 408 at the 10 s header deadline');
ok($all_408->('slow_bodies'), 'every connection trickling its body got 408 at the 10 s body deadline');
is(scalar(@{ $held->{idle} // [] }), 0, 'no idle connection was closed before the 60 s idle deadline');

# --max-connections: one past it is closed at once, the others stay served.
my $bounded = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator, args => [ '--max-connections', '3' ]);
my @three = map { $bounded->connect_raw } 1 .. 3;
my $fourth = $bounded->connect_raw;
ok(StripeEmulatorHarness::read_response($fourth, 5)->{closed}, '--max-connections 3: a fourth connection is closed at once');
write_all($three[0], http_text(method => 'GET', path => '/healthz'));
is(StripeEmulatorHarness::read_response($three[0], 5)->{status}, 200, '... while the three are served');
close $_ for @three, $fourth;
# Under a descriptor limit of 300, clients get what the database and Stripe
# connections leave: 300 - (4 * 8 + 2 * 64 + 64).
my $stderr = "$PostgreSQL::Test::Utils::tmp_check/limited.log";
my ($limited, $announced) = ProxyHarness::spawn($stderr, 'sh', '-c', 'ulimit -n 300 && exec "$0" "$@"', $proxy->command(0));
like($announced // '', qr/^listening on /, 'under a descriptor limit of 300 the proxy starts');
like(slurp_file($stderr), qr/serving at most 76 connections, not --max-connections 10000: the descriptor limit is 300/,
	'... saying it serves at most 76 connections, which leave its own descriptors free');
kill 'TERM', $limited;
waitpid($limited, 0);
$bounded->stop;

like((run_command([ ProxyHarness::binary(), '--help' ]))[0], qr/--header-timeout S.*--body-timeout S.*--idle-timeout S/s,
	'--help describes the deadlines');

$capture->stop;
$stripe->stop;
$proxy->stop;
$emulator->stop;
$node->stop;
done_testing();

package ProxyHarness;

# Starts billguard-proxy for a test and talks to it over HTTP. Its secret
# files (the upstream key, the admin and issuer tokens) are written with
# mode 600 in a directory of the test; the proxy is stopped by pid when the
# test ends, also when it dies half-way (END block).
#
#   my $proxy = ProxyHarness->start(conninfo => $node->connstr('postgres'), upstream => $emulator);
#   my $key = $proxy->issue_key(billing_period => '2026-08', period_usd_cap => 50);
#   my $r = $proxy->charge($key->{vault_key}, 'idem-1', amount => 50);

use strict;
use warnings;

use File::Temp qw(tempdir);
use HTTP::Tiny;
use IO::Select;
use IO::Socket::INET;
use IPC::Run;
use JSON::PP;
use MIME::Base64 qw(encode_base64);
use POSIX ();
use Time::HiRes qw(sleep time);

use StripeEmulatorHarness;
use SecretFile qw(write_secret_file);
use BillguardTest qw(wait_until);

my %running;    # pid => 1, for the END block

sub binary { return $ENV{BILLGUARD_PROXY} // StripeEmulatorHarness::repo_root() . '/worker/billguard-proxy' }

# Options: conninfo (required), upstream (an emulator or a URL), upstream_key
# (default: the emulator harness's test key), admin_token (default: random
# letters), issuer => 0 to start without an
# issuer token, issuer_max_period_usd (its --issuer-max-period-usd; default
# 1000000; undef: none), issuer_max_period => ['AMOUNT:CURRENCY', ...] (its
# --issuer-max-period flags), issuer_bounds => 'default' to keep the proxy's own bounds on the
# issuer's keys (else widened: the tests name fixed periods, such as
# 2026-08, and keys expiring in 2099), port (default 0: any), args => [more
# flags], stderr => file. Dies unless the proxy announces its port.
sub start {
	my ($class, %o) = @_;
	my $self = bless { %o }, $class;
	$self->{dir} //= tempdir(CLEANUP => 1);
	$self->{upstream_url} = ref $o{upstream} ? $o{upstream}->url('') : $o{upstream};
	$self->{admin_token} = $o{admin_token} // 'admin-' . join('', map { ('a' .. 'z')[rand 26] } 1 .. 32);
	$self->{issuer_token} = 'issuer-' . join('', map { ('a' .. 'z')[rand 26] } 1 .. 32);
	$self->{files}{upstream} = write_secret_file("$self->{dir}/stripe.key",
		$o{upstream_key} // $StripeEmulatorHarness::DEFAULT_API_KEY);
	$self->{files}{admin} = write_secret_file("$self->{dir}/admin.token", $self->{admin_token});
	$self->{files}{issuer} = write_secret_file("$self->{dir}/issuer.token", $self->{issuer_token});
	$self->{stderr} //= "$self->{dir}/proxy.log";
	$self->{http} = http_client();
	$self->launch($o{port} // 0);
	return $self;
}

sub command {
	my ($self, $port) = @_;
	return (binary(), '--listen', "127.0.0.1:$port", '--database', $self->{conninfo},
		'--upstream', $self->{upstream_url}, '--upstream-key-file', $self->{files}{upstream},
		'--admin-token-file', $self->{files}{admin},
		(($self->{issuer} // 1)
			? ('--issuer-token-file', $self->{files}{issuer},
				(exists $self->{issuer_max_period_usd} && !defined $self->{issuer_max_period_usd}
					? () : ('--issuer-max-period-usd', $self->{issuer_max_period_usd} // '1000000')),
				(map { ('--issuer-max-period', $_) } @{ $self->{issuer_max_period} // [] }),
				(($self->{issuer_bounds} // 'wide') eq 'default'
					? () : ('--issuer-max-key-days', '36500', '--issuer-period-months', '1200')))
			: ()),
		@{ $self->{args} // [] });
}

# Runs the proxy with @command; returns (pid, the line it printed or undef).
sub spawn {
	my ($stderr, @command) = @_;
	pipe(my $from_child, my $to_parent) or die "pipe: $!";
	my $pid = fork() // die "fork: $!";
	if ($pid == 0) {
		close $from_child;
		open STDOUT, '>&', $to_parent or POSIX::_exit(126);
		open STDERR, '>>', $stderr or POSIX::_exit(126);
		exec @command or POSIX::_exit(127);
	}
	close $to_parent;
	$running{$pid} = 1;
	my $line = StripeEmulatorHarness::read_line_with_timeout($from_child, 20);
	return ($pid, $line, $from_child);
}

sub launch {
	my ($self, $port) = @_;
	my ($pid, $line, $stdout) = spawn($self->{stderr}, $self->command($port));
	die "proxy did not announce its port (got: " . ($line // 'nothing') . "); its log:\n"
	  . (eval { PostgreSQL::Test::Utils::slurp_file($self->{stderr}) } // '') . "\n"
	  unless defined $line && $line =~ /^listening on 127\.0\.0\.1:(\d+)$/;
	@$self{qw(pid port stdout)} = ($pid, $1, $stdout);
	return;
}

# Runs the proxy with these flags and expects it to refuse to start:
# returns (exit status, its stderr).
sub refused_start {
	my ($class, @command) = @_;
	my $dir = tempdir(CLEANUP => 1);
	my ($pid, $line) = spawn("$dir/stderr", binary(), @command);
	waitpid($pid, 0);
	my $status = $? >> 8;
	delete $running{$pid};
	open my $fh, '<', "$dir/stderr" or die;
	local $/;
	my $stderr = <$fh> // '';
	return ($status, $stderr, $line);
}

sub pid  { $_[0]{pid} }
sub port { $_[0]{port} }
sub url  { my ($self, $path) = @_; return "http://127.0.0.1:$self->{port}$path" }
sub log_text { my ($self) = @_; open my $fh, '<', $self->{stderr} or return ''; local $/; return <$fh> // '' }

# SIGTERM (or $signal) and wait; KILL after five seconds.
sub stop {
	my ($self, $signal) = @_;
	my $pid = $self->{pid};
	return unless $running{$pid};
	kill($signal // 'TERM', $pid);
	my $status;
	if (wait_until("the proxy (pid $pid) to exit", 5, sub {
			return 0 unless waitpid($pid, POSIX::WNOHANG()) == $pid;
			$status = $?;
			return 1 }, interval => 0.02)) {
		delete $running{$pid};
		return $status;
	}
	kill 'KILL', $pid;
	waitpid($pid, 0);
	delete $running{$pid};
	return;
}

# Starts it again on the same port (after stop or a kill -9).
sub restart {
	my ($self) = @_;
	$self->launch($self->{port});
	return $self;
}

END {
	my $status = $?;
	for my $pid (keys %running) { kill 'KILL', $pid; waitpid($pid, 0) }
	$? = $status;
}

# ---- HTTP ---------------------------------------------------------------------

# Options: vault_key or token (Authorization: Bearer), basic (the key as
# HTTP basic user), idempotency_key, headers, content_type.
sub http_client { return HTTP::Tiny->new(timeout => 30, keep_alive => 1) }

sub request {
	my ($self, $method, $path, $body, %o) = @_;
	my %headers = %{ $o{headers} // {} };
	$headers{Authorization} = "Bearer $o{vault_key}" if defined $o{vault_key};
	$headers{Authorization} = "Bearer $o{token}" if defined $o{token};
	$headers{Authorization} = 'Basic ' . encode_base64("$o{basic}:", '') if defined $o{basic};
	$headers{'Idempotency-Key'} = $o{idempotency_key} if defined $o{idempotency_key};
	my %arguments = (headers => \%headers);
	if (defined $body) {
		$headers{'Content-Type'} = $o{content_type} // 'application/x-www-form-urlencoded';
		$arguments{content} = $body;
	}
	my $response = $self->{http}->request($method, $self->url($path), \%arguments);
	# The proxy may close a connection after refusing a request (an oversized
	# header or body it did not read): the next request must not race that
	# close on the kept-alive connection.
	$self->{http} = http_client() if ($response->{status} // 0) >= 400;
	$response->{json} = eval { decode_json($response->{content}) } if length($response->{content} // '');
	return $response;
}

# The form body of a confirmed off-session PaymentIntent, as the dispatcher sends it.
sub charge_body {
	my (%params) = @_;
	my %p = (amount => 50, currency => 'usd', customer => 'cus_proxy', payment_method => 'pm_card_visa',
		confirm => 'true', off_session => 'true', %params);
	return StripeEmulatorHarness::form_encode([ map { ($_ => $p{$_}) } grep { defined $p{$_} } sort keys %p ]);
}

# POST /v1/payment_intents with the vault key and Idempotency-Key.
sub charge {
	my ($self, $vault_key, $idempotency_key, %params) = @_;
	return $self->request('POST', '/v1/payment_intents', charge_body(%params),
		vault_key => $vault_key, idempotency_key => $idempotency_key);
}

# The same on a connected account: with Stripe-Account: $account.
sub charge_on {
	my ($self, $account, $vault_key, $idempotency_key, %params) = @_;
	return $self->request('POST', '/v1/payment_intents', charge_body(%params),
		vault_key => $vault_key, idempotency_key => $idempotency_key,
		headers => { 'Stripe-Account' => $account });
}

# POST /keys (issuer token unless as => 'admin'); dies unless 200; returns the key.
sub issue_key {
	my ($self, %fields) = @_;
	my $response = $self->request_key(%fields);
	die "POST /keys: $response->{status} $response->{content}" unless $response->{status} == 200;
	return $response->{json};
}

# POST /keys as it answers. A field given as undef is left out (period_cap
# => 5000, period_usd_cap => undef: a cap in another currency).
sub request_key {
	my ($self, %fields) = @_;
	my $as = delete $fields{as} // 'issuer';
	my %body = (vendor => 'stripe', billing_period => '2026-08', period_usd_cap => 50,
		allowed_endpoints => ['/v1/payment_intents'], expires_at => '2099-01-01T00:00:00Z', %fields);
	delete @body{ grep { !defined $body{$_} } keys %body };
	return $self->request('POST', '/keys', JSON::PP->new->canonical->encode(\%body),
		token => $self->{"${as}_token"}, content_type => 'application/json');
}

# GET /keys/{id} with the admin token: the budget as JSON.
sub key_status {
	my ($self, $key_id) = @_;
	return $self->request('GET', "/keys/$key_id", undef, token => $self->{admin_token})->{json};
}

# Sends every request at once, each on its own connection: all connect,
# then all are written, then every answer is read. Each request is a hash
# of method, path, body, vault_key, idempotency_key. Returns the answers in
# order: {status, headers, body, json}, or {timed_out}/{closed}.
sub concurrently {
	my ($self, @requests) = @_;
	my @sockets = map {
		IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $self->{port}, Proto => 'tcp')
		  // die "connect: $!"
	} @requests;
	for my $i (0 .. $#requests) {
		my $r = $requests[$i];
		my $body = $r->{body} // '';
		my %headers = (Host => "127.0.0.1:$self->{port}", 'Content-Length' => length $body,
			Connection => 'close');
		$headers{Authorization} = "Bearer $r->{vault_key}" if defined $r->{vault_key};
		$headers{'Idempotency-Key'} = $r->{idempotency_key} if defined $r->{idempotency_key};
		$headers{'Content-Type'} = 'application/x-www-form-urlencoded' if length $body;
		my $text = "$r->{method} $r->{path} HTTP/1.1\r\n"
		  . join('', map { "$_: $headers{$_}\r\n" } sort keys %headers) . "\r\n$body";
		syswrite($sockets[$i], $text) == length($text) or die "short write: $!";
	}
	return map { my $a = StripeEmulatorHarness::read_response($_, 120); close $_; $a } @sockets;
}

# POST /v1/payment_intents with $body, sent on a connection of its own and
# not waited for: returns the socket, to read the answer from later
# (StripeEmulatorHarness::read_response).
sub send_charge {
	my ($self, $vault_key, $idempotency_key, $body) = @_;
	my $socket = $self->connect_raw;
	my $text = "POST /v1/payment_intents HTTP/1.1\r\nHost: 127.0.0.1:$self->{port}\r\n"
	  . "Authorization: Bearer $vault_key\r\nIdempotency-Key: $idempotency_key\r\n"
	  . "Content-Type: application/x-www-form-urlencoded\r\nConnection: close\r\n"
	  . 'Content-Length: ' . length($body) . "\r\n\r\n$body";
	syswrite($socket, $text) == length($text) or die "short write: $!";
	return $socket;
}

# A session of $node holding the ledger's lock of an Idempotency-Key of
# stripe's $period budget in USD, as vault_authorize and vault_settle take
# it: they wait for it. Returns once it is held; end_key_lock lets go.
sub hold_key_lock {
	my ($node, $period, $idempotency_key) = @_;
	my $name = "key_holder_$idempotency_key" =~ s/\W/_/gr;
	my $holder = IPC::Run::start(
		[ 'psql', '-XAtq', '-d', $node->connstr('postgres'), '-c', "SET application_name = '$name'",
		  '-c', "BEGIN; SELECT billguard.lock_vault_idempotency_key('stripe', '$period', 'usd', '$idempotency_key'); "
		      . 'SELECT pg_sleep(600)' ],
		'>', \my $out, '2>', \my $err);
	$node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = '$name' AND wait_event = 'PgSleep'")
	  or die "the holder did not take the lock of $idempotency_key";
	return { handle => $holder, name => $name, node => $node };
}

sub end_key_lock {
	my ($lock) = @_;
	$lock->{node}->safe_psql('postgres',
		"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '$lock->{name}'");
	$lock->{handle}->finish;
	return;
}

# A raw connection to the proxy, for what HTTP clients would not send.
sub connect_raw {
	my ($self) = @_;
	return IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $self->{port}, Proto => 'tcp')
	  // die "connect: $!";
}

# The proxy's resident memory (VmRSS) and thread count, from /proc.
sub resident_kib { my ($self) = @_; return proc_status($self->{pid}, 'VmRSS') }
sub threads      { my ($self) = @_; return proc_status($self->{pid}, 'Threads') }
sub proc_status {
	my ($pid, $field) = @_;
	open my $fh, '<', "/proc/$pid/status" or die "/proc/$pid/status: $!";
	local $/;
	my ($value) = <$fh> =~ /^$field:\s*(\d+)/m;
	return $value;
}

sub admin_token  { $_[0]{admin_token} }
sub issuer_token { $_[0]{issuer_token} }

1;

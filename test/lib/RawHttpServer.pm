# A forking HTTP/1.1 server on loopback that writes whatever bytes a test
# gives it: a stand-in for Stripe that no real server would be, to send
# answers the emulator would never send (nested a million deep, 1e1000000,
# not UTF-8). Keep-alive; each connection in a child of its own.
#
#   my $server = RawHttpServer->start(sub {
#       my ($head, $body) = @_;   # request line and headers, raw body
#       return ($status, $answer_body, $request_id);
#   });
#   $server->url('/v1'); $server->requests; $server->stop;
package RawHttpServer;
use strict;
use warnings;
use File::Temp ();
use IO::Socket::INET;
use POSIX ();

sub start {
	my ($class, $answer) = @_;
	my $listen = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 64, ReuseAddr => 1)
	  or die "listen: $!";
	# Children count the requests here: one line each.
	my $requests = File::Temp->new(TEMPLATE => 'raw-http-requests-XXXXXX', TMPDIR => 1);
	my $pid = fork() // die "fork: $!";
	if ($pid == 0) {
		$SIG{CHLD} = 'IGNORE';
		while (my $client = $listen->accept) {
			next if fork();
			serve($client, $answer, $requests->filename);
			POSIX::_exit(0);
		}
		POSIX::_exit(0);
	}
	return bless { pid => $pid, port => $listen->sockport, requests => $requests, owner => $$ }, $class;
}

sub serve {
	my ($client, $answer, $requests_file) = @_;
	my $buffer = '';
	while (1) {
		while ($buffer !~ /\r\n\r\n/) {
			sysread($client, $buffer, 65536, length $buffer) or return;
		}
		my ($head, $rest) = split /\r\n\r\n/, $buffer, 2;
		my ($length) = $head =~ /^content-length:\s*(\d+)/mi;
		$length //= 0;
		while (length($rest) < $length) {
			sysread($client, $rest, 65536, length $rest) or return;
		}
		my $body = substr($rest, 0, $length);
		$buffer = substr($rest, $length);
		open(my $log, '>>', $requests_file) or die "$requests_file: $!";
		print $log "request\n";
		close $log;
		my ($status, $out_body, $request_id) = $answer->($head, $body);
		my $out = "HTTP/1.1 $status X\r\nContent-Type: application/json\r\nRequest-Id: $request_id\r\n"
		  . 'Content-Length: ' . length($out_body) . "\r\n\r\n" . $out_body;
		while (length $out) {
			my $written = syswrite($client, $out) // return;
			substr($out, 0, $written) = '';
		}
	}
}

sub url { my ($self, $path) = @_; return "http://127.0.0.1:$self->{port}$path" }

# How many requests it was sent.
sub requests {
	my ($self) = @_;
	open(my $log, '<', $self->{requests}->filename) or return 0;
	my @lines = <$log>;
	return scalar @lines;
}

sub stop {
	my ($self) = @_;
	return unless $self->{pid};
	kill 'KILL', $self->{pid};
	waitpid($self->{pid}, 0);
	$self->{pid} = undef;
}

# A test that dies still stops its server (only the process that started it).
sub DESTROY { my ($self) = @_; $self->stop if $$ == ($self->{owner} // 0) }

1;

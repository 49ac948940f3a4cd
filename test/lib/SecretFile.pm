# The one writer of the secret files tests hand to billguard, its proxy and
# its webhook check (a Stripe key, a token, a webhook secret): each of them
# refuses a file others may read, so the mode is the test's to choose.
package SecretFile;

use strict;
use warnings;
use Exporter 'import';

our @EXPORT_OK = qw(write_secret_file);

# Writes "$content\n" to $path with mode 0600, or $mode; returns the path.
sub write_secret_file {
	my ($path, $content, $mode) = @_;
	open my $fh, '>', $path or die "cannot write $path: $!";
	print $fh "$content\n";
	close $fh or die "cannot write $path: $!";
	chmod($mode // 0600, $path) or die "cannot chmod $path: $!";
	return $path;
}

1;

#!/usr/bin/env perl
# Assembles an extension script from templates, for the Makefile:
#   sql/assemble.pl -o OUTPUT TEMPLATE...
# Each line "\ir PATH" of a template is replaced by the file PATH names,
# relative to the template's directory as psql's \ir reads it; every other
# line is copied as it is. The templates are the install (sql/install/*.sql)
# and the upgrade scripts (sql/billguard--*.sql.in); what they include is
# one function or view as one version has it (sql/udfs/, sql/views/). An
# included file includes nothing itself, and a file that is missing, empty
# or not ending in a newline fails the build: the script is never written
# short. The C preprocessor is no use here, as SQL bodies hold '#', quotes
# and /* */ that it would read as its own.
use strict;
use warnings;
use File::Basename qw(dirname);

my $output;
if (@ARGV >= 2 && $ARGV[0] eq '-o') {
	(undef, $output) = splice @ARGV, 0, 2;
}
die "usage: $0 -o OUTPUT TEMPLATE...\n" unless defined $output && @ARGV;

sub slurp {
	my ($path, $from) = @_;
	open my $fh, '<', $path or die "$from: cannot read $path: $!\n";
	local $/;
	my $text = <$fh>;
	die "$from: $path is empty\n" if $text eq '';
	die "$from: $path does not end in a newline\n" unless $text =~ /\n\z/;
	return $text;
}

my $script = '';
for my $template (@ARGV) {
	my $line_number = 0;
	for my $line (split /^/, slurp($template, $0)) {
		$line_number++;
		if ($line =~ /^\\ir\s+(\S+)\s*$/) {
			my $included = dirname($template) . "/$1";
			my $text = slurp($included, "$template:$line_number");
			die "$template:$line_number: $included includes another file; an included file must hold its text\n"
			  if $text =~ /^\\i/m;
			$script .= $text;
		} elsif ($line =~ /^\\i/) {
			die "$template:$line_number: only \"\\ir PATH\" is understood: $line";
		} else {
			$script .= $line;
		}
	}
}

# Written whole or not at all, so that make never takes a half-written
# script for a built one.
open my $out, '>', "$output.tmp" or die "$0: cannot write $output.tmp: $!\n";
print $out $script or die "$0: $output.tmp: $!\n";
close $out or die "$0: $output.tmp: $!\n";
rename "$output.tmp", $output or die "$0: cannot rename $output.tmp: $!\n";

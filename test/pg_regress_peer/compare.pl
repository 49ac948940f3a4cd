#!/usr/bin/env perl
# Compares the results/*.out of one run of PostgreSQL's regression suite with
# those of a plain server's run (or of either of two plain runs, when a
# second plain server was run to tell a nondeterministic test from a
# difference).
#   compare.pl --tests FILE --mode exact PLAIN_DIR[,PLAIN_DIR2] OTHER_DIR
#   compare.pl --tests FILE --mode extension --objects FILE PLAIN_DIR[,...] OTHER_DIR
# exact: every test's output must be byte for byte the plain one.
# extension: a test may differ only where a listing of the catalog gains
# rows that name billguard's objects, in one of the statements @listings
# names, with the row count grown by as many; nothing else (not an extra
# notice, not a changed row, not a missing one).
# Prints one line per test that differs, with the lines; exits 1 when any
# difference is not allowed.
use strict;
use warnings;
use File::Temp qw(tempfile);
use Getopt::Long;

# The statements whose listings billguard's objects may join, and why each
# is no change of behaviour. A sanity check that flags one of billguard's
# objects for a real defect (a wrong label, a bad definition) is not here:
# it fails.
my @listings = (
	{   test      => 'opr_sanity',
		statement => qr/WHERE prosecdef/,
		why       => 'billguard\'s API runs as SECURITY DEFINER by design; the check '
		  . 'expects none among the built-in functions'
	},
	{   test      => 'opr_sanity',
		statement => qr/array_upper\(indoption, 1\) != indnatts-1/,
		why       => 'a covering index (INCLUDE) has opclass and option entries for its '
		  . 'key columns only; the check was written for the built-in catalogs, '
		  . 'which have no covering index'
	},
	{   test      => 'event_trigger',
		statement => qr/FROM pg_event_trigger as e,/,
		why       => 'the listing of every event trigger shows billguard_protect_history'
	},
);

my ($tests_file, $mode, $objects_file);
GetOptions('tests=s' => \$tests_file, 'mode=s' => \$mode, 'objects=s' => \$objects_file)
  && @ARGV == 2
  && $mode =~ /^(exact|extension)$/
  && ($mode eq 'exact' || $objects_file)
  or die "usage: $0 --tests FILE --mode exact|extension [--objects FILE] PLAIN[,PLAIN2] OTHER\n";
my @plain_dirs = split /,/, $ARGV[0];
my $other_dir  = $ARGV[1];

my %named;    # OIDs and names of billguard's objects, from the server itself, to names
if ($objects_file) {
	open my $fh, '<', $objects_file or die "$objects_file: $!\n";
	while (<$fh>) {
		chomp;
		my ($oid, $name) = split /\t/;
		$name //= '';
		$named{$oid} = $name;
		$named{$name} = $name if $name ne '';
	}
	die "$objects_file lists no object of billguard\n" unless %named;
}

open my $tfh, '<', $tests_file or die "$tests_file: $!\n";
chomp(my @tests = <$tfh>);

my $max_lines = 80;    # of one test's report: enough to tell what changed
my $failed    = 0;
for my $test (@tests) {
	my $other = "$other_dir/results/$test.out";
	unless (-f $other) { print "FAIL $test: no results/$test.out\n"; $failed = 1; next; }
	my ($verdict, $report);
	for my $plain_dir (@plain_dirs) {
		my $plain = "$plain_dir/results/$test.out";
		unless (-f $plain) { ($verdict, $report) = ('FAIL', "no $plain\n"); next; }
		($verdict, $report) =
		  $mode eq 'exact' ? exact($plain, $other) : extension($test, $plain, $other);
		last if $verdict ne 'FAIL';
	}
	next if $verdict eq 'same';
	my @report = split /\n/, $report;
	splice @report, $max_lines, @report - $max_lines, '  ... (' . (@report - $max_lines) . ' lines more)'
	  if @report > $max_lines + 1;
	print "$verdict $test:\n", map {"$_\n"} @report;
	$failed = 1 if $verdict eq 'FAIL';
}
exit $failed;

sub slurp {
	my ($path) = @_;
	open my $fh, '<', $path or die "$path: $!\n";
	local $/;
	return scalar <$fh>;
}

sub exact {
	my ($plain, $other) = @_;
	return ('same', '') if slurp($plain) eq slurp($other);
	return ('FAIL', scalar `diff -u '$plain' '$other'`);
}

# psql pads the columns of a listing to its widest value, so a billguard row
# widens the rows around it: the extension comparison ignores padding.
sub normalized {
	my @lines = @_;
	for (@lines) { s/^\s+|\s+$//g; s/\s{2,}/ /g; s/-{2,}/-/g; }
	return @lines;
}

# The -U0 hunks between two files of lines, each as [first line, count] of
# the first and of the second (1-based; an insertion has count 0 and names
# the line it goes before).
sub hunks {
	my @files;
	for my $lines (@_) {
		my ($fh, $name) = tempfile(UNLINK => 1);
		print $fh join("\n", @$lines), "\n";
		close $fh;
		push @files, $name;
	}
	my @hunks;
	for (split /\n/, `diff -U0 '$files[0]' '$files[1]'`) {
		next unless /^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@/;
		my ($a_count, $b_count) = ($2 // 1, $4 // 1);
		push @hunks, [ $a_count ? $1 : $1 + 1, $a_count, $b_count ? $3 : $3 + 1, $b_count ];
	}
	return @hunks;
}

sub row_count { return $_[0] =~ /^\((\d+) rows?\)$/ ? $1 : undef; }

sub names_billguard {
	my ($line) = @_;
	return 1 if $line =~ /billguard/i;
	return scalar grep { exists $named{$_} } cells($line);
}

sub cells { return map { s/^\s+|\s+$//gr } split /\|/, $_[0]; }

# A row that names billguard's objects by OID only, shown with their names.
sub with_names {
	my ($line) = @_;
	return $line if $line =~ /billguard/i || grep { !/^\d+$/ && exists $named{$_} } cells($line);
	my @names = map { $named{$_} } grep { /^\d+$/ && exists $named{$_} } cells($line);
	return @names ? "$line   (" . join(', ', @names) . ')' : $line;
}

sub lines_of { return split /\n/, slurp($_[0]), -1; }

sub extension {
	my ($test, $plain, $other) = @_;
	my @plain_raw = lines_of($plain);
	my @other_raw = lines_of($other);
	my @plain_lines = normalized(@plain_raw);
	my @other_lines = normalized(@other_raw);
	my @hunks = hunks(\@plain_lines, \@other_lines);
	return ('same', '') unless @hunks;
	my ($ok, $report, %grown) = (1, '');
	for my $hunk (@hunks) {
		my ($start, $removed_count, $other_start, $added_count) = @$hunk;
		my @removed = @plain_lines[ $start - 1 .. $start + $removed_count - 2 ];
		my @added = @other_lines[ $other_start - 1 .. $other_start + $added_count - 2 ];
		my @added_raw = @other_raw[ $other_start - 1 .. $other_start + $added_count - 2 ];
		# The statement a hunk belongs to: psql echoes it after the blank
		# line that ends the previous result.
		my $first = $start - 1;
		$first-- while $first > 0 && $plain_lines[ $first - 1 ] ne '';
		my $statement = join "\n", @plain_lines[ $first .. $start - 2 ];
		my ($listing) = grep { $_->{test} eq $test && $statement =~ $_->{statement} } @listings;
		# A listing gains rows of an aligned table (psql starts each with a
		# space), each naming an object of billguard, and its row count;
		# a notice, an error or a changed row is never allowed.
		my $rows = 0;
		my $allowed = $listing && !grep { !defined row_count($_) } @removed;
		for my $i (0 .. $#added) {
			next if defined row_count($added[$i]);
			$rows++;
			$allowed = 0 unless $added_raw[$i] =~ /^ / && names_billguard($added[$i]);
		}
		my $shown = join '', map {"  -$_\n"} @plain_raw[ $start - 1 .. $start + $removed_count - 2 ];
		$shown .= join '', map { '  +' . with_names($_) . "\n" } @added_raw;
		# Named by the statement or comment nearest before it, above the
		# listing's header.
		my ($after) = grep { /\w/ && !/^ / } reverse @plain_raw[ 0 .. $start - 2 ];
		my $where = "at line $start (after \"" . ($after // '') . "\")";
		if (!$allowed) {
			$ok = 0;
			$report .= "  $where, "
			  . ($listing ? 'not only rows naming billguard\'s objects' : 'not a listing billguard may join')
			  . ":\n$shown";
			next;
		}
		$grown{$first}{rows} += $rows;
		$grown{$first}{count} += $_ for map { row_count($_) // 0 } @added;
		$grown{$first}{count} -= $_ for map { row_count($_) // 0 } @removed;
		$report .= "  $where, allowed: $listing->{why}:\n$shown";
	}
	for my $first (sort { $a <=> $b } keys %grown) {
		my $g = $grown{$first};
		next if $g->{rows} == $g->{count};
		$ok = 0;
		$report .= "  the listing at line " . ($first + 1) . " gained $g->{rows} rows, its count $g->{count}\n";
	}
	return ($ok ? 'allowed' : 'FAIL', $report);
}

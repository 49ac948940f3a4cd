#!/usr/bin/env perl
# The SQL sources hold to the rules that let each function and view be
# written once, run by `make test` with the house rules:
#   test/check-sql.pl [ROOT]     (ROOT: a copy of the repository; default this one)
# The layout (see the Makefile's SQL section): sql/udfs/<function>/ and
# sql/views/<view>/ hold <version>.sql, the text as that version released
# it, and latest.sql, the text of the version under development (the
# Makefile's EXTVERSION). sql/install/*.sql, the install under development,
# includes latest.sql files; sql/billguard--<version>.sql.in, the install of
# a released version, and sql/billguard--<from>--<to>.sql.in, an upgrade,
# include snapshots. 0.1.0, the first release, is written out whole in
# sql/billguard--0.1.0.sql. Each rule below says what it guards against;
# test/check-sql.t breaks each one on a copy and sees it fail.
use strict;
use warnings;
use Digest::SHA qw(sha256_hex);
use File::Basename qw(basename dirname);
use File::Temp qw(tempdir);
use Cwd qw(abs_path);

my $root = abs_path($ARGV[0] // dirname(__FILE__) . '/..');
my $sql  = "$root/sql";
my $first_release = '0.1.0';
my @problems;
sub problem { push @problems, join('', @_) }

sub slurp {
	my ($path) = @_;
	open my $fh, '<', $path or die "cannot read $path: $!\n";
	local $/;
	return scalar <$fh>;
}

sub version_cmp {
	my @a = split /\./, $_[0];
	my @b = split /\./, $_[1];
	while (@a || @b) {
		my $d = (shift(@a) // 0) <=> (shift(@b) // 0);
		return $d if $d;
	}
	return 0;
}

# The include lines of templates, as sql/assemble.pl reads them: the path
# relative to sql/, and where the line is.
sub includes_of {
	my @includes;
	for my $template (@_) {
		my $dir = dirname($template);
		my $n   = 0;
		for my $line (split /\n/, slurp($template)) {
			$n++;
			next unless $line =~ /^\\ir\s+(\S+)\s*$/;
			my $path = "$dir/$1";
			1 while $path =~ s{/(?!\.\./)[^/]+/\.\./}{/};
			$path =~ s{^\Q$sql\E/}{};
			push @includes, { path => $path, at => substr($template, length($root) + 1) . ":$n" };
		}
	}
	return @includes;
}

# ---- the versions --------------------------------------------------------------------

my ($development) = slurp("$root/Makefile") =~ /^EXTVERSION\s*=\s*(\S+)/m
  or die "no EXTVERSION in $root/Makefile\n";
my @released = sort { version_cmp($a, $b) } $first_release,
  map { /billguard--([\d.]+)\.sql\.in$/ ? $1 : () } glob("$sql/billguard--*.sql.in");
# Without a version under development newer than every release, no other
# rule means anything.
die "check-sql: the version under development, $development, has a frozen install"
  . " (sql/billguard--$development.sql.in): it was released, so EXTVERSION must move on\n"
  if grep { $_ eq $development } @released;
die "check-sql: EXTVERSION $development is not newer than the last release, $released[-1]\n"
  if version_cmp($development, $released[-1]) <= 0;
my @versions = (@released, $development);
my %previous = map { ($versions[$_] => $versions[$_ - 1]) } 1 .. $#versions;
my %known    = map { ($_ => 1) } @versions;

# ---- the objects and their snapshots -------------------------------------------------

my %objects;    # "udfs/name" => { snapshots => [versions, ascending], latest => bool }
for my $dir (glob("$sql/udfs/* $sql/views/*")) {
	my $object = substr($dir, length($sql) + 1);
	my (@snapshots, $latest);
	for my $file (glob("$dir/*")) {
		my $name = basename($file);
		if ($name eq 'latest.sql') {
			$latest = 1;
		} elsif ($name =~ /^(\d+\.\d+\.\d+)\.sql$/ && $known{$1}) {
			push @snapshots, $1;
		} else {
			problem("sql/$object/$name: neither latest.sql nor the snapshot of a version (",
				join(', ', @versions), ')');
		}
	}
	@snapshots = sort { version_cmp($a, $b) } @snapshots;
	$objects{$object} = { snapshots => \@snapshots, latest => $latest };
}

# Rule: latest.sql is the newest snapshot, byte for byte. A change to a
# released function must come as a snapshot of the version under
# development, which the upgrade to it then includes; an edit of latest.sql
# alone would reach fresh installs and never an updated database.
for my $object (sort keys %objects) {
	my $o = $objects{$object};
	next unless $o->{latest};
	if (!@{ $o->{snapshots} }) {
		problem("sql/$object: latest.sql has no snapshot: a new object needs sql/$object/$development.sql too");
		next;
	}
	my $newest = $o->{snapshots}[-1];
	problem("sql/$object/latest.sql differs from its newest snapshot, $newest.sql: a change since $newest",
		" goes into sql/$object/$development.sql (the same text), included by the upgrade to $development")
	  if slurp("$sql/$object/latest.sql") ne slurp("$sql/$object/$newest.sql");
}

# Rule: a file defines the object its directory names and nothing else, a
# function in udfs/, a view in views/, so that one name has one home.
for my $object (sort keys %objects) {
	my ($kind, $name) = split m{/}, $object;
	for my $file (glob("$sql/$object/*.sql")) {
		my $text = slurp($file);
		my @defined = $text =~ /^\s*CREATE\s+(?:OR\s+REPLACE\s+)?(FUNCTION|PROCEDURE|VIEW)\s+([\w.]+)/gim;
		my $expected = $kind eq 'udfs' ? 'FUNCTION' : 'VIEW';
		problem("sql/$object/", basename($file), " defines no ", lc $expected, " billguard.$name") unless @defined;
		while (my ($what, $whom) = splice @defined, 0, 2) {
			problem("sql/$object/", basename($file), " defines ", lc $what, " $whom: it holds ", lc $expected,
				" billguard.$name only")
			  unless uc $what eq $expected && lc $whom eq "billguard.$name";
		}
	}
}

# ---- the installs --------------------------------------------------------------------

my @parts     = sort glob("$sql/install/*.sql");
my @templates = map { "$sql/billguard--$_.sql.in" } grep { $_ ne $first_release } @released;
my @upgrades  = sort glob("$sql/billguard--*--*.sql.in");

# Rule: no function or view is written out in a template, only included:
# a definition typed into the install or an upgrade is the second copy
# that can disagree with the first. An upgrade may make a function of its
# own for its migration (a backfill by a former encoder, say) if it drops
# it again and no object of sql/udfs/ has its name: it never outlives the
# update.
for my $template (@parts, @templates, @upgrades) {
	my @lines = split /\n/, slurp($template);
	for my $n (1 .. @lines) {
		my $line = $lines[$n - 1];
		next unless $line =~ /^\s*CREATE\s+(?:OR\s+REPLACE\s+)?(FUNCTION|PROCEDURE|AGGREGATE|VIEW|MATERIALIZED\s+VIEW)\s+([\w.]+)/i;
		my ($what, $name) = (uc $1, lc $2);
		my $dropped_later = join("\n", @lines[$n .. $#lines]) =~ /^\s*DROP\s+FUNCTION\s+\Q$name\E\(/mi;
		next if $what eq 'FUNCTION' && grep({ $_ eq $template } @upgrades) && $dropped_later
		  && $name =~ /^billguard\.(\w+)$/ && !$objects{"udfs/$1"};
		problem(substr($template, length($root) + 1), ":$n: a definition outside sql/udfs/ or sql/views/: $line");
	}
}

# What each version's install holds: object => the version of the text it
# includes (latest.sql for the version under development).
my %install;
sub note_included {
	my ($version, $include) = @_;
	my ($object, $file) = $include->{path} =~ m{^((?:udfs|views)/[^/]+)/([^/]+)\.sql$}
	  or return problem("$include->{at}: includes $include->{path}, which is not a function or a view of sql/udfs/ or sql/views/");
	return problem("$include->{at}: includes sql/$include->{path}, which does not exist")
	  unless -f "$sql/$include->{path}";
	return problem("$include->{at}: includes $include->{path}: the install under development includes latest.sql, never a snapshot")
	  if $version eq $development && $file ne 'latest';
	return problem("$include->{at}: includes $include->{path}: a released install includes snapshots, never latest.sql")
	  if $version ne $development && $file eq 'latest';
	return problem("$include->{at}: includes $object a second time") if exists $install{$version}{$object};
	$install{$version}{$object} = $file;
}

# Rule: the install under development includes every latest.sql once and
# no snapshot: an object left out would exist after an update and not in a
# fresh install.
note_included($development, $_) for includes_of(@parts);
for my $object (sort keys %objects) {
	problem("sql/install/*.sql: never includes sql/$object/latest.sql")
	  if $objects{$object}{latest} && !exists $install{$development}{$object};
}

# Rule: the install of a released version includes, of each object it
# holds, the newest snapshot at that version, and every snapshot of that
# version: what sql/release.sh wrote when it froze it.
for my $version (grep { $_ ne $first_release } @released) {
	my $template = "$sql/billguard--$version.sql.in";
	for my $include (includes_of($template)) {
		note_included($version, $include);
		my ($object, $file) = $include->{path} =~ m{^((?:udfs|views)/[^/]+)/([^/]+)\.sql$} or next;
		next unless $objects{$object};
		my ($newest) = reverse grep { version_cmp($_, $version) <= 0 } @{ $objects{$object}{snapshots} };
		problem("$include->{at}: includes $object/$file.sql, but the install of $version holds ",
			($newest // 'no snapshot'), ".sql, its newest snapshot at $version")
		  unless defined $newest && $file eq $newest;
	}
	for my $object (sort keys %objects) {
		problem("sql/billguard--$version.sql.in: never includes sql/$object/$version.sql")
		  if grep({ $_ eq $version } @{ $objects{$object}{snapshots} }) && !exists $install{$version}{$object};
	}
}

# Rule: the text of the first release, written out whole before the
# layout, holds each of its snapshots verbatim.
my $first_install = slurp("$sql/billguard--$first_release.sql");
for my $object (sort keys %objects) {
	next unless grep { $_ eq $first_release } @{ $objects{$object}{snapshots} };
	problem("sql/$object/$first_release.sql does not appear verbatim in sql/billguard--$first_release.sql")
	  if index($first_install, slurp("$sql/$object/$first_release.sql")) < 0;
}

# ---- the upgrades --------------------------------------------------------------------

# Rule: one upgrade leads into each version after the first, from the one
# before it, and it includes exactly the snapshots of its version, each
# once: a function changed in a version reaches updated databases through
# the upgrade to that version, and through no other.
my %upgrade_of;
for my $upgrade (@upgrades) {
	my ($from, $to) = basename($upgrade) =~ /^billguard--([\d.]+)--([\d.]+)\.sql\.in$/
	  or problem(substr($upgrade, length($root) + 1), ": not billguard--<from>--<to>.sql.in"), next;
	problem(substr($upgrade, length($root) + 1), ": $to is not a version after the first (", join(', ', @versions), ")"), next
	  unless $previous{$to};
	problem(substr($upgrade, length($root) + 1), ": the upgrade into $to starts from $previous{$to}, the version before it")
	  unless $from eq $previous{$to};
	$upgrade_of{$to} = $upgrade;
	my %seen;
	for my $include (includes_of($upgrade)) {
		my ($object, $file) = $include->{path} =~ m{^((?:udfs|views)/[^/]+)/([^/]+)\.sql$};
		if (!defined $object || !-f "$sql/$include->{path}") {
			problem("$include->{at}: includes $include->{path}, which is not a snapshot of sql/udfs/ or sql/views/");
		} elsif ($file ne $to) {
			problem("$include->{at}: includes $object/$file.sql: the upgrade to $to includes snapshots of $to only",
				$file eq 'latest' ? ' (latest.sql changes after the release; the snapshot does not)' : '');
		} elsif ($seen{$object}++) {
			problem("$include->{at}: includes $object a second time");
		}
	}
	for my $object (sort keys %objects) {
		problem(substr($upgrade, length($root) + 1), ": never includes sql/$object/$to.sql, so an updated",
			" database would not have what a fresh $to install has")
		  if grep({ $_ eq $to } @{ $objects{$object}{snapshots} }) && !$seen{$object};
	}
}
for my $version (@versions[1 .. $#versions]) {
	problem("no upgrade into $version: sql/billguard--$previous{$version}--$version.sql.in is missing")
	  unless $upgrade_of{$version};
}

# Rule: every object of an install reaches an updated database: it changed
# in that version (a snapshot of it, which the upgrade includes) or it is
# in the install of the version before, and so on back to the first
# release (whose snapshots its text holds).
for my $version (@versions[1 .. $#versions]) {
	for my $object (sort keys %{ $install{$version} // {} }) {
		next if grep { $_ eq $version } @{ $objects{$object}{snapshots} // [] };
		my $before = $previous{$version};
		my $there = $before eq $first_release
		  ? grep({ $_ eq $first_release } @{ $objects{$object}{snapshots} // [] })
		  : exists $install{$before}{$object};
		problem("$object is in the install of $version, unchanged since an earlier version, but not in the",
			" install of $before: no upgrade path creates it")
		  unless $there;
	}
}

# ---- released scripts never change ----------------------------------------------------

# Rule: every script of a released version (its install, the upgrades
# between released versions) has the bytes it was released with, recorded
# in sql/released.sha256 when it was frozen: a change to a frozen snapshot,
# template or the assembler would change what a packager ships as the same
# version.
my $build = tempdir(CLEANUP => 1);
sub built {
	my ($name) = @_;
	return slurp("$sql/$name") if -f "$sql/$name" && !-f "$sql/$name.in";
	return undef unless -f "$sql/$name.in";
	my $output = "$build/$name";
	system($^X, "$sql/assemble.pl", '-o', $output, "$sql/$name.in") == 0 or return undef;
	return slurp($output);
}
my %recorded;
if (open my $fh, '<', "$sql/released.sha256") {
	while (<$fh>) {
		next if /^\s*(#|$)/;
		my ($hash, $name) = /^([0-9a-f]{64})\s+(\S+)$/ or problem("sql/released.sha256:$.: not \"<sha256>  <script>\": $_"), next;
		$recorded{$name} = $hash;
	}
} else {
	problem("sql/released.sha256 is missing");
}
my @released_scripts = (
	(map { "billguard--$_.sql" } @released),
	(map { "billguard--$released[$_ - 1]--$released[$_].sql" } 1 .. $#released));
for my $name (@released_scripts) {
	my $text = built($name);
	if (!defined $text) {
		problem("sql/$name, a released script, cannot be built or found");
	} elsif (!$recorded{$name}) {
		problem("sql/$name, a released script, has no line in sql/released.sha256");
	} elsif (sha256_hex($text) ne $recorded{$name}) {
		problem("sql/$name is not the script released: its sha256 is ", sha256_hex($text),
			", sql/released.sha256 says $recorded{$name}");
	}
}
for my $name (sort keys %recorded) {
	problem("sql/released.sha256 names $name, which is not a script of a released version")
	  unless grep { $_ eq $name } @released_scripts;
}

if (@problems) {
	print STDERR "check-sql: $_\n" for @problems;
	exit 1;
}
printf "check-sql: %d functions and views, each written once per version that changed it; %d released scripts unchanged\n",
  scalar(keys %objects), scalar(@released_scripts);

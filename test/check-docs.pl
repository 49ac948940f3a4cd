#!/usr/bin/env perl
# The documentation holds to what a reader relies on, run by `make test`
# with the house rules:
#   test/check-docs.pl [ROOT]     (ROOT: a copy of the repository; default this one)
# - every relative link of README.md, CHANGELOG.md, docs/*.md and the
#   programs' READMEs leads to a file that exists, and a #fragment to a
#   heading of that file: a moved or renamed section leaves no dead link;
# - every billguard.* setting the C++ defines (DefineCustom*Variable under
#   extension/) has its row in docs/configuration.md's table, and every row
#   there is a setting the C++ defines: one table users can trust;
# - every function and view of sql/udfs/ and sql/views/ is named in
#   docs/sql-api.md;
# - no document cites the project's tracker ("issue 6", "item 12"): a
#   reader outside it cannot follow such a reference.
# test/check-docs.t breaks each rule on a copy and sees it fail.
use strict;
use warnings;
use File::Basename qw(dirname);
use File::Find qw(find);
use File::Spec;
use Cwd qw(abs_path);

my $root = abs_path($ARGV[0] // dirname(__FILE__) . '/..');
binmode($_, ":encoding(UTF-8)") for \*STDOUT, \*STDERR;
my @problems;
sub problem { push @problems, join('', @_) }

sub slurp { my ($path) = @_; open my $fh, '<:encoding(UTF-8)', $path or die "cannot read $path: $!\n"; local $/; scalar <$fh> }

# The documents, relative to the root.
my @documents = grep { -f "$root/$_" } ('README.md', 'CHANGELOG.md', 'worker/README.md',
	'tools/stripe-emulator/README.md', map { s{^\Q$root\E/}{}r } sort glob("$root/docs/*.md"));

# Markdown outside fenced code blocks: a link shown as code is no link.
sub prose {
	my ($text) = @_;
	my $in_fence = 0;
	my @kept;
	for my $line (split /\n/, $text, -1) {
		if ($line =~ /^\s*```/) { $in_fence = !$in_fence; next }
		push @kept, $in_fence ? '' : $line;
	}
	return join("\n", @kept);
}

# The anchors GitHub makes of a file's headings: lower case, punctuation but
# '-' and '_' dropped, spaces as '-', a repeated one numbered.
my %anchors_of;
sub anchors {
	my ($path) = @_;
	return $anchors_of{$path} //= do {
		my (%anchors, %seen);
		for my $line (split /\n/, prose(slurp($path))) {
			next unless $line =~ /^#{1,6}\s+(.*?)\s*#*\s*$/;
			my $slug = lc $1;
			$slug =~ s/\[([^\]]*)\]\([^)]*\)/$1/g;
			$slug =~ s/[^\p{L}\p{N}_\- ]//g;
			$slug =~ s/ /-/g;
			my $n = $seen{$slug}++;
			$anchors{ $n ? "$slug-$n" : $slug } = 1;
		}
		\%anchors;
	};
}

for my $document (@documents) {
	my $text = prose(slurp("$root/$document"));
	$text =~ s/`[^`\n]*`//g;    # inline code
	my $line_of = sub { my ($offset) = @_; 1 + (() = substr($text, 0, $offset) =~ /\n/g) };
	while ($text =~ /\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g) {
		my ($target, $at) = ($1, $-[0]);
		next if $target =~ m{^[a-z][a-z0-9+.-]*:}i;    # https:, mailto:
		my ($file, $fragment) = $target =~ /^([^#]*)(?:#(.*))?$/;
		my $where = "$document:" . $line_of->($at);
		my $path = $file eq '' ? "$root/$document" : File::Spec->catfile(dirname("$root/$document"), $file);
		if (!-e $path) {
			problem("$where: the link to $target leads to no file ($file)");
			next;
		}
		next unless defined $fragment && $fragment ne '';
		if ($path !~ /\.md$/ || -d $path) {
			problem("$where: the link to $target names a section of a file that has none");
		} elsif (!anchors(abs_path($path))->{$fragment}) {
			problem("$where: the link to $target names no heading of " . ($file eq '' ? $document : $file));
		}
	}
	my $raw = slurp("$root/$document");
	while ($raw =~ /\b((?:issue|item)s?\s+#?\d+)/gi) {
		problem("$document: cites the tracker (\"$1\"): say what it is about instead");
	}
}

# The settings: what the C++ defines, against the table's rows.
my %defined;
find({ no_chdir => 1, wanted => sub {
	return unless /\.(?:cpp|hpp|h|cc)$/;
	my $code = slurp($_);
	$defined{$1} = 1 while $code =~ /DefineCustom\w+Variable\s*\(\s*"(billguard\.[A-Za-z0-9_]+)"/g;
} }, "$root/extension");
problem('no billguard.* setting found in the C++ of extension/') unless %defined;
my $configuration = "$root/docs/configuration.md";
if (-f $configuration) {
	my %documented;
	my $table = slurp($configuration);
	$documented{$1}++ while $table =~ /^\|\s*`(billguard\.[A-Za-z0-9_]+)`\s*\|/mg;
	for my $setting (sort keys %defined) {
		problem("docs/configuration.md: $setting is defined in extension/ but has no row in the settings table")
			unless $documented{$setting};
	}
	for my $setting (sort keys %documented) {
		problem("docs/configuration.md: $setting has a row but extension/ defines no such setting")
			unless $defined{$setting};
		problem("docs/configuration.md: $setting has $documented{$setting} rows, not one")
			if $documented{$setting} > 1;
	}
} else {
	problem('docs/configuration.md is missing');
}

# The SQL API: every function and view the SQL sources define is named.
my $api = "$root/docs/sql-api.md";
if (-f $api) {
	my $text = slurp($api);
	for my $dir (sort glob("$root/sql/udfs/* $root/sql/views/*")) {
		next unless -d $dir;
		my ($name) = $dir =~ m{/([^/]+)$};
		problem("docs/sql-api.md: names no function or view $name (sql/" . ($dir =~ m{/views/} ? 'views' : 'udfs') . "/$name)")
			unless $text =~ /`(?:view )?(?:billguard\.)?\Q$name\E[`(]/;
	}
} else {
	problem('docs/sql-api.md is missing');
}

if (@problems) {
	print STDERR "check-docs: $_\n" for @problems;
	printf STDERR "check-docs: %d problem%s\n", scalar @problems, @problems == 1 ? '' : 's';
	exit 1;
}
printf "check-docs: %d documents, %d settings, every link resolves\n", scalar @documents, scalar keys %defined;

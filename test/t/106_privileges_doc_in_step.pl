# The grants docs/privileges.md documents under "The grants" are the grants
# test/pgtap/09_privileges.sql runs: the pgTAP test proves that they work as
# written only while the two say the same, to the letter. docs/privileges.md
# is the one file that holds them; the tests that need them read them there
# or are checked against it here.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;

my $root = $ENV{BILLGUARD_ROOT};
my $doc = slurp_file("$root/docs/privileges.md");
my $pgtap = slurp_file("$root/test/pgtap/09_privileges.sql");

my ($documented) = $doc =~ /^## The grants\n.*?^```sql\n(.*?)^```\n/ms;
my ($tested) = $pgtap =~ /^-- docs\/privileges\.md grants: begin\n(.*?)^-- docs\/privileges\.md grants: end\n/ms;
ok(defined $documented, 'docs/privileges.md has an sql block under "## The grants"');
ok(defined $tested, '09_privileges.sql marks the grants of docs/privileges.md');
like($documented // '', qr/TO billing_app;.*TO billing_accounts;.*TO billing_ops;.*TO billing_webhooks;/s,
	'the grants cover the application, the accounts maintainer, the operator and the webhooks');
is($tested, $documented, 'the grants the pgTAP test runs are those of docs/privileges.md, verbatim');

done_testing();

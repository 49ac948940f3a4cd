# Reading back: list (immediately consistent) and search (eventually
# consistent, the subset of the query language billguard uses).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(sleep);
use StripeEmulatorHarness;

my $emulator = StripeEmulatorHarness->start(args => ['--search-delay-ms', '800']);
sub intent_params { StripeEmulatorHarness::payment_intent_params(@_) }
sub ids { return [map { $_->{id} } @{ $_[0]{json}{data} }] }

my @mine = map {
  $emulator->post_form('/v1/payment_intents',
    intent_params(customer => 'cus_list', amount => 1000 + $_, 'metadata[billguard_key]' => "key-$_"))->{json}{id}
} 1 .. 3;
my $other = $emulator->post_form('/v1/payment_intents', intent_params(customer => 'cus_other',
  'metadata[billguard_key]' => 'key-1'))->{json}{id};
my $charge = $emulator->post_form('/v1/charges', [amount => 700, currency => 'usd', customer => 'cus_list',
  'metadata[billguard_key]' => 'key-1'])->{json}{id};

subtest 'search is eventually consistent: nothing before the delay' => sub {
  my $response = $emulator->get('/v1/payment_intents/search', [query => "metadata['billguard_key']:'key-2'"]);
  is($response->{status}, 200, 'HTTP 200');
  is($response->{json}{object}, 'search_result', 'a search_result');
  is_deeply($response->{json}{data}, [], 'not visible yet');
  is($response->{json}{url}, '/v1/payment_intents/search', 'url');
};

subtest 'list is immediately consistent, newest first' => sub {
  my $response = $emulator->get('/v1/payment_intents', [customer => 'cus_list']);
  is($response->{status}, 200, 'HTTP 200');
  is($response->{json}{object}, 'list', 'a list');
  is_deeply(ids($response), [reverse @mine], 'this customer\'s intents, newest first');
  ok(!$response->{json}{has_more}, 'has_more false');
  is($response->{json}{url}, '/v1/payment_intents', 'url');

  my $page = $emulator->get('/v1/payment_intents', [customer => 'cus_list', limit => 2]);
  is_deeply(ids($page), [@mine[2, 1]], 'limit 2');
  ok($page->{json}{has_more}, 'has_more true');
  my $next = $emulator->get('/v1/payment_intents', [customer => 'cus_list', limit => 2, starting_after => $mine[1]]);
  is_deeply(ids($next), [$mine[0]], 'starting_after continues');
  ok(!$next->{json}{has_more}, 'last page');

  is_deeply(ids($emulator->get('/v1/charges', [customer => 'cus_list'])), [$charge], 'charges list');
  is(scalar @{ $emulator->get('/v1/payment_intents')->{json}{data} }, 4, 'without customer: everything');
  is($emulator->get('/v1/payment_intents', [limit => 0])->{status}, 400, 'limit 0: 400');
  is($emulator->get('/v1/payment_intents', [limit => 101])->{status}, 400, 'limit 101: 400');
  is($emulator->get('/v1/payment_intents', [starting_after => 'pi_nope'])->{status}, 400, 'unknown cursor: 400');
  is($emulator->get('/v1/payment_intents', [status => 'succeeded'])->{status}, 400, 'unknown parameter: 400');
};

sleep 0.9;

subtest 'search after the delay' => sub {
  my $response = $emulator->get('/v1/payment_intents/search', [query => "metadata['billguard_key']:'key-2'"]);
  is_deeply(ids($response), [$mine[1]], 'found by metadata');
  ok(!$response->{json}{has_more}, 'has_more false');

  my $both = $emulator->get('/v1/payment_intents/search', [query => "metadata['billguard_key']:'key-1'"]);
  is_deeply(ids($both), [$other, $mine[0]], 'every match, newest first');
  my $narrowed = $emulator->get('/v1/payment_intents/search',
    [query => "metadata['billguard_key']:'key-1' AND customer:'cus_list'"]);
  is_deeply(ids($narrowed), [$mine[0]], 'AND customer narrows it');
  is_deeply(ids($emulator->get('/v1/payment_intents/search', [query => qq{customer:"cus_other"}])), [$other],
    'double quotes work too');
  is_deeply(ids($emulator->get('/v1/charges/search', [query => "metadata['billguard_key']:'key-1'"])), [$charge],
    'charges search');
  is_deeply($emulator->get('/v1/payment_intents/search', [query => "metadata['billguard_key']:'nope'"])->{json}{data},
    [], 'no match: empty');

  my $first_page = $emulator->get('/v1/payment_intents/search', [query => "customer:'cus_list'", limit => 2]);
  ok($first_page->{json}{has_more}, 'limit 2 of 3: has_more');
  my $second_page = $emulator->get('/v1/payment_intents/search',
    [query => "customer:'cus_list'", limit => 2, page => $first_page->{json}{next_page}]);
  is_deeply(ids($second_page), [$mine[0]], 'next_page continues');
};

subtest 'a plus sign in the query string is a space' => sub {
  my $response = $emulator->get("/v1/payment_intents/search?query=metadata%5B%27billguard_key%27%5D%3A%27key-3%27+AND+customer%3A%27cus_list%27");
  is_deeply(ids($response), [$mine[2]], 'decoded');
};

subtest 'unsupported queries are refused' => sub {
  for my $query ("status:'succeeded'", "metadata['k']:'v' OR customer:'cus_x'", "metadata['k']~'v'",
                 "customer:cus_x", "metadata[k]:'v'", "customer:'cus_x' AND", "", "metadata['k']:'v") {
    my $response = $emulator->get('/v1/payment_intents/search', [query => $query]);
    is($response->{status}, 400, "\"$query\": 400");
    is($response->{json}{error}{type}, 'invalid_request_error', "\"$query\": invalid_request_error");
  }
  is($emulator->get('/v1/payment_intents/search')->{status}, 400, 'no query: 400');
};

subtest 'the delay can change at run time' => sub {
  $emulator->configure(search_delay_ms => 0);
  my $id = $emulator->post_form('/v1/payment_intents',
    intent_params('metadata[billguard_key]' => 'instant'))->{json}{id};
  is_deeply(ids($emulator->get('/v1/payment_intents/search', [query => "metadata['billguard_key']:'instant'"])),
    [$id], 'visible at once with delay 0');
};

$emulator->stop;
done_testing;

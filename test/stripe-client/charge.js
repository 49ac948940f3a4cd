// The official Stripe client against billguard-proxy: creates PaymentIntents
// with a vault key until the proxy's cap refuses one, and prints one JSON
// line per call (what the client returned, or the Stripe error it raised).
//   node charge.js PORT VAULT_KEY COUNT AMOUNT
'use strict';
const Stripe = require('stripe');

async function main() {
  const [port, vaultKey, count, amount] = process.argv.slice(2);
  const stripe = new Stripe(vaultKey, { host: '127.0.0.1', port: Number(port), protocol: 'http' });
  for (let i = 1; i <= Number(count); i++) {
    try {
      const intent = await stripe.paymentIntents.create(
        { amount: Number(amount), currency: 'usd', customer: `cus_node${i}`,
          payment_method: 'pm_card_visa', confirm: true, off_session: true,
          // The client's API version turns automatic payment methods on:
          // without redirects, as billguard asks, no return_url is needed.
          automatic_payment_methods: { enabled: true, allow_redirects: 'never' } },
        { idempotencyKey: `node-client-${i}` });
      console.log(JSON.stringify({ id: intent.id, status: intent.status, amount: intent.amount }));
    } catch (error) {
      console.log(JSON.stringify({
        stripe_error: error instanceof Stripe.errors.StripeError, class: error.constructor.name,
        status: error.statusCode, type: error.rawType, code: error.code, message: error.message }));
    }
  }
}

main().catch((error) => { console.error(error); process.exit(1); });

// Package leases provides leases with database-clock expiry and fences:
// for long jobs, leader election and cron on many replicas — the work that
// must run on exactly one of N processes.
//
// A lease is a row in pgfence.leases: a name, the owner of the current
// grant, the grant's fence, and expires_at. PostgreSQL is the only judge of
// who holds a lease, and its clock (clock_timestamp()) the only clock that
// decides expiry; no two machines' clocks are ever compared.
//
//	client, err := leases.New(pool, leases.WithOwner("billing"))
//	...
//	defer client.Close()
//	err = client.Run(ctx, "billing/nightly", 30*time.Second,
//		func(ctx context.Context, l *leases.Lease) error {
//			return invoice(ctx, l.Token()) // stops when ctx ends
//		})
//
// # State model
//
// A grant of a lease moves through these states:
//
//	free ──Acquire/TryAcquire──▶ held ──Release──▶ released
//	                              │
//	                              ├─ renewal finds no row ──▶ lost
//	                              └─ local deadline passes ─▶ lost
//
// Granting is one call of pgfence.try_acquire (an upsert that succeeds when
// there is no row or the row's expires_at has passed by the database
// clock). Every grant's fence is the database clock in microseconds, raised
// past the lease's previous fence: fences strictly increase across grants,
// releases, expiries, force-releases and restarts, and exceed every fence a
// lost history issued (a failover to an asynchronous standby, a restore).
// Every
// grant also gets a new owner: the client's prefix (WithOwner) plus a
// random suffix, so that a renewal or release can only ever match the
// exact grant — (name, owner, fence) — it was made for. "No row" means
// lost, at once.
//
// A Lease's Context is cancelled, with a cause, when it leaves "held":
// the cause wraps ErrReleased after Release (and Close), ErrLost otherwise.
// A lost or released Lease never becomes held again; acquire anew.
//
// # The deadline rule
//
// The client stops trusting a lease at its local deadline:
//
//	deadline = start of the last successful grant/renew request + TTL − margin
//
// measured on the monotonic clock of the holder, where margin is TTL/10
// (100ms for the minimum TTL of 1s). The server computed expires_at as its
// clock at some moment after that request started, plus the TTL; so the
// deadline falls strictly before expires_at, by at least the margin, with
// no assumption about the two clocks except that they run at about the same
// rate (the margin absorbs rate drift and timer lateness). A renewal
// response that arrives after the deadline does not revive the lease.
//
// The monotonic clock stops while the system is suspended (on Linux), so
// the client checks held leases by the wall clock too, every second: a
// lease whose deadline either clock has passed is lost, within a second of
// a resume (or of a wall clock stepped forward past it).
//
// A grant may wait inside its statement before the server sets expires_at:
// a takeover waits there for the former holder's fenced transactions to
// end. The server reports how long, from the statement's start by its own
// clock, and the grant's start moves later by that wait, bounded by the
// round trip the client saw. The statement began after the request was
// sent, so the rule above still holds, and a takeover that waited longer
// than the TTL still gets a lease with its whole TTL ahead.
//
// Hence guarantee: the holder's context is cancelled before anyone else can
// be granted the lease by expiry.
//
// # What Context() means for your work
//
// Do the lease's work under Lease.Context (Run and Lead hand it to fn).
// While it is not done, no other owner holds the lease, as long as this
// process is not paused: a process stopped (GC pause, SIGSTOP, a VM
// migration) longer than the margin may resume with a context that has not
// yet been cancelled although the lease has expired and been granted to
// someone else. No timeout can close that gap; fences do. Pass Token() with
// every write to a protected table (package fencing) so that PostgreSQL
// rejects a stale holder's writes, and have external systems compare
// fences. Check the context before every externally visible effect, and
// make effects idempotent.
//
// # Keepalive
//
// Each Client runs one keepalive goroutine, whatever the number of leases.
// A lease is due for renewal TTL/3 after its last successful request
// started; the keepalive renews every lease due within the next TTL/12 in
// one batched statement, so leases coalesce into a few statements per
// period. Rows that are locked at that moment (a takeover or force-release
// in progress) are skipped and retried
// shortly, so one busy lease cannot delay the others. A renewal that finds
// no row loses that lease at once; a failed statement (network, restart)
// is retried with backoff from 25ms to 1s until each lease's own deadline
// timer fires. A statement is given TTL/3 (the batch's shortest), so that
// one stuck on a silent connection leaves time to retry on another; when
// recent renewals were slow, three times what they took per lease, up to
// the earliest deadline, so that a slow server or a large batch does not
// cancel every attempt. Lease.Renew renews one lease on demand.
//
// # Data with a lease
//
// A grant may carry a small JSON value (at most MaxDataLen = 1024 bytes,
// compact): WithData attaches it in the statement that grants, at no extra
// round trip, and Lease.SetData replaces it while the grant is held — the
// leader publishes its address, a job its progress. Get, List, Observe,
// HeldError and `pgfence leases ls` show it (Info.Data, in jsonb's text
// form). Only the current grant can write it: pgfence.set_data names
// (name, owner, fence) and writes only while the grant is live by the
// database clock, so an update racing a takeover or force-release either
// commits before it (and the next grant starts without data) or matches no
// row and is rejected with ErrLost. Oversize or malformed values, and JSON
// that jsonb cannot store (bytes that are not UTF-8, a \u0000 escape, a
// lone surrogate escape, a number beyond numeric's range), return
// ErrInvalid and write nothing; PostgreSQL enforces the same bound
// (SQLSTATE 22023) for SQL callers. SetData wakes the lease's observers.
//
// # Extending with a new TTL
//
// Lease.Extend renews the grant now with a different TTL, longer or
// shorter. The local deadline is recomputed by the same rule (start of the
// Extend request + new TTL − new TTL/10) and replaces the old one even
// when sooner; the keepalive then renews with the new TTL. A shorter TTL
// takes effect here before the request is sent, and stays if its answer
// is lost: the statement may commit all the same. Renew, Extend and the
// keepalive's batch are serialised per lease, so the local deadline always
// falls before the expiry PostgreSQL applied last.
//
// # Hand-over
//
// Release expires the grant now and, in the same statement, sends NOTIFY
// pgfence_leases (payload: the name) — but only when some client waits for
// or observes the lease, which it says by holding the name's wait key (see
// interest.go): a notifying commit serialises with every other. The row
// stays, expired: rows are never deleted, so every grant after a name's
// first draws its fence under the row lock, after the previous grant
// committed, and fences increase in grant order. Waiting acquirers listen on
// a dedicated connection per Client, beside a second one that holds the wait
// keys (both taken from the pool and hijacked when something first waits,
// observes or leads), so a waiter on another replica holds the lease about
// one round trip after the release. Within one Client, waiters on a name
// queue up and only the head attempts, so a release costs one attempt per
// Client, not one per waiter; a release by the same Client wakes the head
// directly. A waiter also wakes just after the holder's expires_at (computed
// by the server as a remaining duration), and polls at WithPollInterval
// (jittered), backing off from 50ms while no listener works. When the
// listener starts listening (again), it wakes every waiter and has every
// lease its Client holds renewed at once: a release, force-release or
// hand-over request it could not hear meanwhile is found that way. Behind a
// pooler in transaction or statement mode LISTEN succeeds but notifications
// never arrive: after LISTEN the listener sends itself a probe NOTIFY from
// another connection, and if three probes in a row (a few seconds apart)
// do not come back within 2s each it logs that once at Info, stops, and
// waiters poll.
//
// # Requested hand-over
//
// RequestHandover (`pgfence leases handover NAME`; role pgfence_operator)
// asks the holder of a lease to step down, for a rolling deploy: River's
// RequestResign. pgfence.request_handover marks the current grant by its
// fence (a later grant is never affected) and notifies. The holder's
// keepalive learns of it at its next renewal, which the notification
// brings forward to about a round trip when the holder's client listens
// (Lead's always does; a client that never waits, observes or leads learns
// within TTL/3). The holder's Context then ends with cause ErrHandover, but
// the lease stays held and renewed until it is released (Renew, Extend and
// SetData still work, to wind down; Err reports a later loss): Run and Lead
// release as soon as fn returns (Lead campaigns again only after one TTL),
// and a waiter on any replica, woken by the release, takes over within a
// round trip. So — unlike ForceRelease — no one else holds the lease while
// the old holder's work may still run. RequestHandover waits until the
// grant it asked is gone; a holder that does not release within its
// timeout is reported (ErrHandoverTimeout, naming it) and keeps the lease.
// A wait that the caller's context cuts short returns the context's error
// (naming the holder too), not ErrHandoverTimeout.
//
// # Leader election
//
// Lead campaigns for a lease, runs fn while leader, and after losing the
// lease campaigns again, until its context ends; then it releases. At most
// one candidate is leader at a time as judged by PostgreSQL, and a leader's
// fn context ends at its local deadline, before another can be granted the
// lease by expiry. Lead keeps a listener, so a leader also notices at once
// when its lease is released under it.
//
// # Failure handling
//
//   - PostgreSQL unreachable: renewals are retried until the local deadline,
//     then the lease is lost; its row expires by itself. Acquire returns
//     the error; Lead logs it and retries with backoff.
//   - Holder crashed: nothing renews the row; it expires after at most the
//     TTL and a waiter is woken at that moment.
//   - Holder paused past its TTL: its context may still look alive when it
//     resumes; its renewals fail ("no row") and fences reject its writes.
//   - ForceRelease (the operator's break-glass) expires the grant now and
//     notifies. PostgreSQL may grant the lease again at once, while the old
//     holder learns at its next renewal (TTL/3 at most; about a round trip
//     if its client has a listener, as Lead's does; at once if its own
//     client is granted the lease again). During that window
//     only fences protect: use it when the holder is stuck, not as a
//     routine hand-over.
//   - Caller gives up during a grant (ctx ends while the statement runs):
//     closing the connection would lose the answer, not the grant — a
//     commit waiting for a synchronous standby still commits — and leave
//     the lease held for its TTL by an owner nobody knows. The client
//     sends a cancel request instead, again until the statement answers
//     (one that arrives before the statement is ignored), and waits for
//     the answer (up to WithReleaseTimeout): the call returns the lease
//     if the grant committed first, else ctx's error with nothing held.
//     With no answer
//     (the server unreachable; at once if the cancel request could not be
//     sent) the error says the grant is in doubt, and a grant that
//     committed expires after its TTL.
//   - Lease lost at the local deadline: the client expires the grant it may
//     still own, so that waiters need not wait for the margin to pass.
//   - Release fails (PostgreSQL unreachable, ctx ended): the lease is
//     released locally, and the client ends the grant in the background, or
//     Close does (once Close has begun, Release tries once more itself,
//     bounded by WithReleaseTimeout); a lease under HoldAtLeast expires
//     after its TTL instead.
//   - Missing or out-of-date schema: errors say "schema pgfence missing
//     or out of date: run `pgfence migrate up`".
//   - Close releases every held lease (one statement, bounded by
//     WithReleaseTimeout, default 5s; a lease whose row an open transaction
//     locks is waited for apart, so it holds up no other), makes
//     waiting Acquire calls return ErrClosed, closes Observe channels, and
//     returns once every goroutine of the Client has exited.
//
// # Metrics
//
// A Client records through the OpenTelemetry metric API on the provider of
// WithMeterProvider (default: the global one, which records nothing until
// the application installs an SDK provider). The package never depends on
// an SDK or exporter. Instruments, created once in New:
//
//	pgfence.lease.acquire.duration  histogram, s       try, outcome
//	pgfence.lease.hold.duration     histogram, s       outcome
//	pgfence.lease.renewals          counter, {renewal} outcome
//	pgfence.lease.lost              counter, {lease}   cause
//	pgfence.lease.held              gauge, {lease}     (none)
//	pgfence.lease.leader            gauge, {election}  (none)
//
// The fenced transactions of Once and OnceTx count their rejections on
// package fencing's pgfence.fenced_writes.rejected, on the same provider
// (and start their spans on the Client's tracer provider).
//
// held and leader are observable up-down counters, read from the Client's
// state at collection: the leases it holds now, and the Lead calls that
// lead now (with WithNameAttribute: 1 per election led, by name).
//
// acquire.duration runs from an Acquire (try=false) or TryAcquire
// (try=true) call, after input validation, to the grant or the failure;
// outcome is acquired, held (TryAcquire only), canceled (ctx ended),
// closed (the Client closed) or error. Lead and Run acquire through
// Acquire. hold.duration runs from the grant's response to Release or
// Close (outcome released) or to the loss (outcome lost). renewals counts
// renewal attempts per lease, by the keepalive (one per lease in a batch)
// and Lease.Renew: renewed (the database extended the grant), busy (the row
// was locked by a fenced transaction; retried shortly), lost (the grant was
// gone), error (the statement failed; retried until the local deadline).
//
// lost counts each held lease that was lost, once, by cause:
//
//   - force_released: the renewal that a release notification for the
//     lease made this Client run at once matched no live row (someone
//     ended the grant — pgfence leases release --force, ForceRelease on
//     another Client), or this Client's own ForceRelease ended a lease it
//     held. It needs the listener: a Client that never waits, observes or
//     leads (or runs WithNotifications(false)) learns of a force-release
//     only at its next renewal, counted as renew_rejected.
//   - renew_rejected: a scheduled renewal (or Lease.Renew, Extend) matched
//     no live row: the grant expired by the database clock (the holder was
//     paused, or its renewals were delayed, past expires_at), was
//     force-released unnoticed, or was taken over after expiry.
//   - deadline: the local deadline passed with no successful renewal (the
//     database unreachable or slow, renewals blocked, the process starved).
//     The holder learned of it before expires_at.
//   - release_rejected: Release found the grant already gone or expired —
//     it had been lost unnoticed, so the work under it may not have been
//     exclusive.
//
// With WithNameAttribute(true) every measurement also carries name, the
// lease name; it is off by default because each name is a separate time
// series.
//
// # Tracing
//
// A Client starts spans through the OpenTelemetry trace API on the
// provider of WithTracerProvider (default: the global one):
// pgfence.lease.acquire (the wait included), pgfence.lease.renew (Renew,
// Extend, each keepalive batch), pgfence.lease.release,
// pgfence.lease.force_release and pgfence.lease.handover, with attributes
// pgfence.lease.name and pgfence.lease.fence; package fencing adds
// pgfence.fenced_tx around InTx. Until a provider is installed nothing is
// started and nothing allocated (a few tens of nanoseconds per call).
//
// Logs (WithLogger; discarded by default): "leases: acquired" and
// "leases: released" at Debug; "leases: force-released" at Info (owner and
// fence only when this Client held the lease); "leases: lease lost" at
// Warn with name, owner, fence, cause (as above), held and err; renewal
// retries, listener trouble and campaign failures at Warn. Lease names are
// the attribute name throughout.
//
// # database/sql
//
// NewDB takes a *sql.DB (pgx's stdlib driver or lib/pq; GORM's and sqlx's
// unwrap to one). Everything works as over a pool except that database/sql
// cannot LISTEN: waiters learn of releases by polling (WithPollInterval),
// and OnceTx, whose fn takes a pgx.Tx, is pgx-only. Fence writes with
// fencing.InDBTx. Over a driver other than pgx's, a grant whose caller
// gives up may end in doubt (NewDB says why).
//
// # Names
//
// A lease name is 1 to 200 bytes of UTF-8 without NUL. Names are global to
// the database: prefix them with the application ("billing/nightly",
// "search/indexer-leader"). Bad input — a bad name, a TTL under 1s, a bad
// option — returns an error naming the setting and writes nothing.
//
// A name's row stays after its release, which is what keeps each lease's
// fences increasing. Name a lease after what it guards (a job, a tenant, a
// shard), not after one run of it: a name per run ("nightly/<uuid>") adds
// a row to pgfence.leases each time, about 400 bytes with its index entry
// for 40-byte names and owners. Operators delete rows expired long ago
// with `pgfence leases prune`, which keeps fences increasing by raising
// the fence floor (docs/operators.md).
package leases

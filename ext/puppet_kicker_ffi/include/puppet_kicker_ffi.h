/*
 * puppet_kicker_ffi.h: the C ABI of libpuppet_kicker_ffi.so, puppet-kicker's Rust core
 * for callers that cannot load a Ruby C extension (JRuby/puppetserver through Ruby's
 * ffi). ABI version 12. See ext/puppet_kicker_ffi/README.md.
 *
 * Requests: `len` bytes of UTF-8 JSON at `req` (no NUL needed; null only with len 0).
 *
 * Replies: every `char *` returned is a new NUL-terminated UTF-8 JSON document owned
 * by the caller, to be passed to pk_free() exactly once. It is either
 *     {"ok": VALUE}
 * or  {"error": {"kind": KIND, "message": MESSAGE}}
 * with KIND one of: "query" (a malformed clause or role), "config" (puppet_kicker.yaml,
 * or not configured yet), "no_data" (the index holds no server), "report" (a malformed
 * kick report), "io", "request" (a malformed request: a bug in the caller), "internal" (a Rust panic,
 * caught). No function unwinds or aborts: errors are data.
 *
 * A server is its facts, in the core's order, then "certname" unless a fact has that
 * name: exactly the Hash the magnus extension returns. pk_servers_at gives it as ids
 * of the index generation, pk_values the names and values behind them.
 *
 * Threads: every function may be called from any number of threads at once. There
 * is one core per loaded library, shared by all callers in the process (all JRuby
 * instances of a puppetserver). The library is linked with -z nodelete, so dlclose
 * never unloads it (the core keeps a background refresh thread).
 */
#ifndef PUPPET_KICKER_FFI_H
#define PUPPET_KICKER_FFI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI version this library implements (12); check it before any other call. */
uint32_t pk_abi_version(void);

/* ok: "0.1.0 (index format 2)", the core's version. */
char *pk_version(void);

/* req: {"confdir": s, "vardir": s, "server_datadir": s|null, "config_file": s|null,
 *       "hostcert": s|null, "hostprivkey": s|null, "localcacert": s|null, "hostcrl": s|null}
 * (Puppet's settings; config_file is PUPPET_KICKER_CONFIG; the four certificate
 * settings are what the PuppetDB source presents and trusts unless puppet_kicker.yaml
 * says otherwise). An optional field absent, null or empty is not given; any other
 * field is a "request" error. ok: null.
 * Reuses the core while the settings are unchanged; a new core when they differ. */
char *pk_configure(const uint8_t *req, size_t len);

/* req: {"op": "servers_with_role", "roles": [s, ...], "environment": s}
 *    | {"op": "server_with_role",  "roles": [s, ...], "environment": s}
 *    | {"op": "servers_with_facts", "clauses": [s, ...], "environment": s}
 * A role is a name or "/regex/". ok: {"generation": n, "answer": n, "positions": [n, ...]}:
 * the selection, in fqdn-then-certname order, as the index generation and positions
 * (at most one for server_with_role), so that a caller keeping the servers it
 * converted per generation fetches only new ones. The same non-zero answer is the
 * same answer to an identical call: a caller may return what it built for it. With
 * "known": A in the request (the answer the caller holds for this query), a reply
 * whose answer is A leaves "positions" out. */
char *pk_select(const uint8_t *req, size_t len);

/* 1 when `answer`, a non-zero answer id pk_select gave, is still what that identical
 * call would get now (same index generation, still kept, no server past max_age);
 * then, as the call would, it queues a refresh of an index older than cache.ttl.
 * 0 otherwise (0, an unknown or replaced id, no index, not configured): make the
 * call with pk_select, which answers and reports any error. No JSON: a caller that
 * kept what it built for `answer` returns it for the cost of this call. */
uint32_t pk_answer_holds(uint64_t answer);

/* req: {"generation": n, "positions": [n, ...]}. ok: [[[K, ...], [V, ...], certname],
 * ...]: each server at those positions of that index as its fact names' string ids
 * (K), their values' ids (V) in the same order, and the certname to add as
 * "certname" (null when a fact has that name); or null once the index has been
 * replaced (select again). */
char *pk_servers_at(const uint8_t *req, size_t len);

/* A fetch session: which names and values of an index generation one caller holds,
 * and under which number in its table, so pk_fetch sends each once. Free it with
 * pk_session_free() (null is ignored) once no pk_fetch uses it. Null only on an
 * internal failure. */
void *pk_session_new(void);
void pk_session_free(void *session);

/* The servers at `count` `positions` of index `generation`, with the fact names and
 * values they hold (at any depth) that the caller, holding `have` objects from
 * `session`, lacks; another `have` than the session sent, or another generation,
 * starts the session over from 0. One binary buffer in native byte order (layout:
 * ext/puppet_kicker_ffi/src/fetch.rs): u64 length; u32 status (0 ok, 1 stale:
 * select again, 2 failed: the JSON is an error reply), base, counts; u32 words;
 * UTF-8 text; JSON. Never null; pass it to pk_free_fetch() exactly once. Its length
 * in bytes is written to *length (unless length is null): read no byte past it, and
 * check the buffer's own u64 length against it. */
uint8_t *pk_fetch(void *session, uint64_t generation, uint64_t have, const uint32_t *positions, size_t count,
                  size_t *length);

/* req: {"generation": n, "values": [V, ...], "keys": [K, ...]}. ok: {"values":
 * [value, ...], "keys": [name, ...]} in the order asked, each id of that index
 * generation; null once the index has been replaced or for an id it does not have
 * (select again). A caller keeps them per generation: equal values share one id. */
char *pk_values(const uint8_t *req, size_t len);

/* req: {"certname": s, "environment": s}: where a node compiles. ok: null. */
char *pk_note_environment(const uint8_t *req, size_t len);

/* The masterless helper: finishes, in this process, what a `puppet apply` left undone
 * (a refresh, kicks) for these settings, then returns. req: as pk_configure's. ok: how
 * it ended, a string ("Done", "AlreadyRunning": another helper holds the cache
 * directory, or "LifetimeOver { undelivered: n }"). Blocks until then. */
char *pk_run_helper(const uint8_t *req, size_t len);

/* ok: [[level, message], ...] to log since the last call: the core's warnings, then
 * what the kick dispatcher logged. */
char *pk_take_log(void);

/* How many lines pk_take_log would give now (0 before pk_configure), no JSON: a
 * caller skips pk_take_log when it is 0. Lines logged right after wait for the next
 * call. Saturates at UINT32_MAX. */
uint32_t pk_log_pending(void);

/* ok: {"servers": n, "index_bytes": n, "built_at": n|null, "last_error": s|null,
 *      "config_file": s|null, "cache_dir": s, "failures": n, "retry_at": n|null,
 *      "work_left": [s, ...], "helper": {...}|null}. */
char *pk_status(void);

/* The kick report processor. req: a report's kicks, {"host": s, "environment": s,
 * "time": ms, "noop": b, "kicks": [...]} as lib/puppet_kicker/kick.rb builds them.
 * ok: [[level, message], ...] to log (level: "info", "notice", "warning", "err");
 * the core dispatches the kicks in the background. */
char *pk_kick(const uint8_t *req, size_t len);

/* req: {"name": SUBCOMMAND, "args": {...}}, a `puppet kicker` subcommand (see
 * src/command/ in the core). ok: its answer, as a JSON text in a string. */
char *pk_command(const uint8_t *req, size_t len);

/* Waits, bounded by kick.exit_wait, for due kicks to be sent (a process about to
 * exit). ok: [[level, message], ...]. */
char *pk_kick_flush(void);

/* ok: the kick status document's JSON text, as a string. */
char *pk_kick_status(void);

/* Frees a reply of any pk_* function; null is ignored. */
void pk_free(char *reply);

/* Frees a reply of pk_fetch; null is ignored. */
void pk_free_fetch(uint8_t *reply);

#ifdef __cplusplus
}
#endif

#endif /* PUPPET_KICKER_FFI_H */

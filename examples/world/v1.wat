;; hello, version 1: a WASI p1 module (cairn compiles WAT text) that echoes
;; every line it reads on stdin to stdout, the broker's own messages (a
;; shutdown before an upgrade or rollback) included. README.md deploys
;; v1.wat, upgrades it to v2.wat and rolls back.
(module
  (import "wasi_snapshot_preview1" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (func (export "_start") (local $n i32)
    (block $eof (loop $next
      ;; one iovec at 16: the buffer at 64 KiB, 64 KiB long; bytes read at 24
      (i32.store (i32.const 16) (i32.const 65536))
      (i32.store (i32.const 20) (i32.const 65536))
      (drop (call $read (i32.const 0) (i32.const 16) (i32.const 1) (i32.const 24)))
      (local.set $n (i32.load (i32.const 24)))
      (br_if $eof (i32.eqz (local.get $n)))
      ;; write back what was read: an iovec at 0, bytes written at 8
      (i32.store (i32.const 0) (i32.const 65536))
      (i32.store (i32.const 4) (local.get $n))
      (drop (call $write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
      (br $next)))))

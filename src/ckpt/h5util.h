/* h5util: the small pieces every writer of checkpoint files needs — scalar
 * and string attributes, and making a finished file durable and visible
 * (fsync, rename, fsync of the folder) — shared by the trainer's parallel
 * writer and zreshard. */
#ifndef ZT_H5UTIL_H
#define ZT_H5UTIL_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>

#include "src/core/err.h"

/* Each returns 0 on success, nonzero on an HDF5 failure. */
int zt_h5_write_str_attr(hid_t obj, const char *name, const char *value);
int zt_h5_write_scalar_attr(hid_t obj, const char *name, hid_t file_type, hid_t mem_type,
                            const void *value);
/* 0 when obj has a scalar attribute `name` readable as mem_type. */
int zt_h5_read_scalar_attr(hid_t obj, const char *name, hid_t mem_type, void *value);

/* The one reader of string attributes, for ztrain's loader and the
 * tools alike, so that both accept the same files: a scalar string of
 * fixed length (as zt_h5_write_str_attr writes it, NUL- or space-padded)
 * or of variable length (h5py's default), at most `max` bytes, malloc'ed
 * into *out. Absent: ZT_OK with *out NULL. Present but not a single
 * string, longer than max or unreadable: ZT_EINPUT, the message naming
 * `what` (the file) and the attribute. */
int zt_h5_attr_str(hid_t obj, const char *name, const char *what, size_t max, char **out,
                   zt_err *e);

/* HDF5 1.10 decodes an attribute message of a version-1 object header
 * (files without metadata checksums, as ztrain wrote before) without
 * checking its lengths against the message: a damaged length reads past
 * it, far enough to crash. zt_h5_check_header reads the object header at
 * file address addr (UINT64_MAX: the root group's) itself first: 0 when
 * its attribute messages fit, or it is not version 1 (checksummed: HDF5
 * verifies it) or cannot be read here (HDF5 then says why); -1 with what
 * is wrong in why[n]. */
int zt_h5_check_header(const char *path, uint64_t addr, char *why, size_t n);

/* What HDF5's error stack says went wrong, most telling part first (an
 * operating-system or MPI-IO reason such as "No space left on device"
 * when one is there); clears the stack. Returns buf (n bytes). */
const char *zt_h5_error_reason(char *buf, size_t n);

/* Bytes free to this user on the file system holding `path` (a folder),
 * or -1 when unknown. */
long long zt_fs_free_bytes(const char *path);

/* Writes n bytes at offset off of fd, resuming after short writes and
 * signals: 0, or the errno of the failure. */
int zt_fs_pwrite(int fd, const void *buf, size_t n, long long off);
/* Reads n bytes at offset off of fd: 0, or the errno of the failure (EIO
 * when the file ends first). */
int zt_fs_pread(int fd, void *buf, size_t n, long long off);

/* Writes runs of bytes at given offsets of an existing file, for data
 * that is written once and not read back soon (checkpoints): through the
 * page cache only what cannot bypass it. Each run's whole 4 KiB blocks go
 * out with O_DIRECT from an aligned staging buffer (adjacent runs are
 * merged into large writes); the partial blocks at a run's ends, which
 * other writers of the file (another rank, HDF5's metadata) may share,
 * go through the page cache, where writes to one block merge. Where the
 * file system refuses O_DIRECT, everything goes through the page cache.
 * Several processes may write disjoint runs of one file at once. */
typedef struct zt_fs_writer zt_fs_writer;

/* Opens path (which exists) for writing with a staging buffer of about
 * `buffer` bytes: 0, or the errno of the failure. */
int zt_fs_writer_open(zt_fs_writer **w, const char *path, size_t buffer);
/* Writes n bytes from src at offset off (they may wait in the staging
 * buffer until a flush): 0, or the errno of a failed write (this one or an
 * earlier one). */
int zt_fs_writer_put(zt_fs_writer *w, const void *src, size_t n, long long off);
/* Writes what waits in the staging buffer: 0 or the first errno. */
int zt_fs_writer_flush(zt_fs_writer *w);
/* Writes what waits in the staging buffer; with sync, then makes the
 * file's data durable (fdatasync); closes and frees. 0 or an errno. */
int zt_fs_writer_close(zt_fs_writer *w, int sync);

/* Reads runs of bytes at given offsets of a file. A run read with
 * `direct` bypasses the page cache (O_DIRECT, whole 4 KiB blocks around
 * the run through an aligned staging buffer): for data this process alone
 * reads, once. Without it, or where the file system refuses O_DIRECT, it
 * goes through the page cache: for data other processes of the node read
 * too, which then find it there. */
typedef struct zt_fs_reader zt_fs_reader;

/* 0, or the errno of the failure. */
int zt_fs_reader_open(zt_fs_reader **r, const char *path, size_t buffer);
/* Reads n bytes at offset off into dst: 0, or the errno of the failure
 * (EIO when the file ends first). */
int zt_fs_reader_get(zt_fs_reader *r, void *dst, size_t n, long long off, int direct);
void zt_fs_reader_close(zt_fs_reader *r);

/* Allocates the file's blocks up to `size` bytes (fallocate), so that
 * writers fill allocated space: ext4 then takes concurrent O_DIRECT
 * writes to one file in parallel instead of one at a time, and a full
 * disk fails here, before any data is written. 0, or the errno (a file
 * system that cannot preallocate is not an error: 0). */
int zt_fs_reserve(const char *path, long long size);

/* fsync a file or folder by path; 0 on success. */
int zt_fs_sync(const char *path);

/* Makes the finished file tmp visible as path, durably: fsync, rename,
 * fsync of the folder. ZT_ERUNTIME with the reason on failure. */
int zt_fs_publish(const char *tmp, const char *path, zt_err *e);

/* ZT_EINPUT when the folder of path cannot be written; `what` names the
 * option in the message ("--save", "-o"). Found before any work. */
int zt_fs_check_writable(const char *what, const char *path, zt_err *e);

/* Whether HDF5 can convert a stored number of this type safely: it
 * converts by the precision, offset and bit fields the file states, which
 * HDF5 1.10 does not check against the size (damaged ones read past the
 * value). Integers whose bits fit their size, and IEEE floats. */
int zt_h5_plain_number(hid_t type);

/* File-access property: write HDF5 1.10's file format (superblock v3,
 * object headers v2), whose metadata carries checksums, so that a damaged
 * file is refused by HDF5 itself instead of being decoded blindly (1.10.8
 * reads past its buffers on some damaged v1 headers). Readers need HDF5
 * >= 1.10 (h5py on Debian 12 has 1.10.8). */
void zt_h5_checked_metadata(hid_t fapl);

#endif

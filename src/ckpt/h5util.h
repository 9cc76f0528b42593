/* h5util: the small pieces every writer of checkpoint files needs — scalar
 * and string attributes, and making a finished file durable and visible
 * (fsync, rename, fsync of the folder) — shared by the trainer's parallel
 * writer and zreshard. */
#ifndef ZT_H5UTIL_H
#define ZT_H5UTIL_H

#include <hdf5.h>

#include "src/core/err.h"

/* Each returns 0 on success, nonzero on an HDF5 failure. */
int zt_h5_write_str_attr(hid_t obj, const char *name, const char *value);
int zt_h5_write_scalar_attr(hid_t obj, const char *name, hid_t file_type, hid_t mem_type,
                            const void *value);
/* 0 when obj has a scalar attribute `name` readable as mem_type. */
int zt_h5_read_scalar_attr(hid_t obj, const char *name, hid_t mem_type, void *value);

/* A fixed-length string attribute (as zt_h5_write_str_attr writes it),
 * at most `max` bytes: malloc'ed into *out. 0 on success; -1 when absent
 * or of another kind. */
int zt_h5_read_str_attr(hid_t obj, const char *name, size_t max, char **out);

/* What HDF5's error stack says went wrong, most telling part first (an
 * operating-system or MPI-IO reason such as "No space left on device"
 * when one is there); clears the stack. Returns buf (n bytes). */
const char *zt_h5_error_reason(char *buf, size_t n);

/* Bytes free to this user on the file system holding `path` (a folder),
 * or -1 when unknown. */
long long zt_fs_free_bytes(const char *path);

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

/* The cyclic collector's own algorithm, run on a subset of the heap, without collecting.
 *
 * A leak check's exit must tell a block held only by garbage cycles from one something live
 * holds. When the cycle already sits in the collector's oldest generation, only a collection
 * of the whole heap finds it. These helpers decide it for the objects above the block's
 * tensors instead:
 *
 *   1. the set S: the tensors, then every object of the heap that refers to a member, found
 *      by passes over the heap (a member found during a pass is looked for in the same pass),
 *      and after each pass the objects near the members (a few references down) that refer
 *      to a member: the rest of a cycle through them, wherever the heap's lists put it;
 *   2. on S, what gc_collect_main does on a generation: an object's references from outside
 *      S are its reference count minus the references members hold to it (tp_traverse); an
 *      object with any is reachable, and so is every member it refers to; the rest is
 *      garbage that nothing but other garbage refers to.
 *
 * Correct for any S: a reference from outside S only makes a member look reachable, so a
 * bounded S may say "reachable" where a whole collection says garbage, never the reverse;
 * the passes stop as soon as every tensor is garbage. And what S finds garbage is closed
 * upwards: its referrers are all in S (its count says so) and garbage too, so the objects
 * above a garbage tensor are the ones the whole collection finds above it.
 * When no pass adds a member, S holds every object above the tensors, and the answer is the
 * whole collection's for them (its referrers are all in S, so each member's outside count
 * is the one the collector computes).
 *
 * Only public C API: tp_traverse, Py_REFCNT, PyObject_IS_GC. Allocates no Python object
 * while it walks (plain malloc), runs no Python code, needs the GIL.
 */
#ifndef TORCHMEM_PYTHON_SUBSET_COLLECTION_H_
#define TORCHMEM_PYTHON_SUBSET_COLLECTION_H_

#include <Python.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The items of `objects` (a list) that are instances of `type`, as a new list. */
PyObject* TorchmemInstancesOf(PyObject* objects, PyObject* type);

/* Runs steps 1 and 2 for `seeds` (a list whose items are also in `objects`, a list of the
 * heap's objects in the collector's order) with at most `max_passes` passes over `objects`
 * and at most `max_members` members. Returns a new tuple (garbage, complete, passes,
 * members, finalizers): `garbage` lists the members found unreachable in `objects`' order,
 * `complete` is True when the last pass added no member, `finalizers` counts the garbage
 * a collection would run a finalizer on (tp_finalize not yet run, or tp_del). The references
 * `objects` and `seeds` hold are discounted; the caller must hold no other reference to a member.
 * NULL with an exception set on error (MemoryError, TypeError). */
PyObject* TorchmemSubsetGarbage(PyObject* objects, PyObject* seeds, Py_ssize_t max_passes,
                                Py_ssize_t max_members);

/* The exact types (Py_TYPE, never __class__) of the items of `objects` (a list), as a new
 * set; and the items whose exact type is in `types` (a set), as a new list: one pass over a
 * heap's list in C, where a Python comprehension takes 50 ms over 400,000 objects. */
PyObject* TorchmemTypesOf(PyObject* objects);
PyObject* TorchmemObjectsOfTypes(PyObject* objects, PyObject* types);

/* Step 2 alone on `objects` (a list of GC-tracked objects, such as the young generations'):
 * a new list of those nothing outside the list refers to, directly or through a reachable
 * one, in `objects`' order: what a collection of exactly those objects would find
 * unreachable. The list's own references are discounted; any other reference (a caller's
 * variable) makes an object reachable. NULL with an exception set on error. */
PyObject* TorchmemUnreachableAmong(PyObject* objects);

#ifdef __cplusplus
}
#endif

#endif /* TORCHMEM_PYTHON_SUBSET_COLLECTION_H_ */

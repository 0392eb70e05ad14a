/* See subset_collection.h. */
#include "torchmem/python/subset_collection.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Members: an open-addressing table from object address to member number, and per member
 * its address, its position in `objects` (-1 until seen there) and its outside count. */
typedef struct {
  PyObject** keys;   /* table: address or NULL */
  Py_ssize_t* slots; /* table: member number */
  size_t mask;
  PyObject** members;
  Py_ssize_t* position;
  Py_ssize_t* outside;
  Py_ssize_t count;
  Py_ssize_t capacity;
} Members;

static size_t Hash(PyObject* op) {
  uintptr_t value = (uintptr_t)op >> 4;
  return (size_t)(value * 0x9E3779B97F4A7C15ull);
}

static Py_ssize_t Find(const Members* s, PyObject* op) {
  for (size_t i = Hash(op) & s->mask;; i = (i + 1) & s->mask) {
    if (s->keys[i] == op) return s->slots[i];
    if (s->keys[i] == NULL) return -1;
  }
}

static int Init(Members* s, Py_ssize_t capacity) {
  memset(s, 0, sizeof(*s));
  size_t table = 64;
  while (table < (size_t)capacity * 2) table <<= 1;
  s->keys = (PyObject**)calloc(table, sizeof(PyObject*));
  s->slots = (Py_ssize_t*)malloc(table * sizeof(Py_ssize_t));
  s->members = (PyObject**)malloc((size_t)capacity * sizeof(PyObject*));
  s->position = (Py_ssize_t*)malloc((size_t)capacity * sizeof(Py_ssize_t));
  s->outside = (Py_ssize_t*)malloc((size_t)capacity * sizeof(Py_ssize_t));
  s->mask = table - 1;
  s->capacity = capacity;
  return s->keys && s->slots && s->members && s->position && s->outside ? 0 : -1;
}

static void Free(Members* s) {
  free(s->keys);
  free(s->slots);
  free(s->members);
  free(s->position);
  free(s->outside);
}

/* Adds `op` (absent) at `position`; 0, or -1 when full (capacity is the member bound). */
static int Add(Members* s, PyObject* op, Py_ssize_t position) {
  if (s->count == s->capacity) return -1;
  size_t i = Hash(op) & s->mask;
  while (s->keys[i] != NULL) i = (i + 1) & s->mask;
  s->keys[i] = op;
  s->slots[i] = s->count;
  s->members[s->count] = op;
  s->position[s->count] = position;
  s->outside[s->count] = 0;
  ++s->count;
  return 0;
}

static int VisitIsMember(PyObject* op, void* arg) {
  return Find((const Members*)arg, op) >= 0; /* non-zero stops the traversal */
}

static int VisitSubtract(PyObject* op, void* arg) {
  Members* s = (Members*)arg;
  Py_ssize_t member = Find(s, op);
  if (member >= 0) --s->outside[member];
  return 0;
}

typedef struct {
  Members* s;
  char* reachable;
  Py_ssize_t* stack;
  Py_ssize_t depth;
} Reach;

static int VisitReach(PyObject* op, void* arg) {
  Reach* r = (Reach*)arg;
  Py_ssize_t member = Find(r->s, op);
  if (member >= 0 && !r->reachable[member]) {
    r->reachable[member] = 1;
    r->stack[r->depth++] = member;
  }
  return 0;
}

static int Traverse(PyObject* op, visitproc visit, void* arg) {
  if (!PyObject_IS_GC(op)) return 0;
  traverseproc traverse = Py_TYPE(op)->tp_traverse;
  return traverse == NULL ? 0 : traverse(op, visit, arg);
}

/* Forward from the members: the objects near them (a few references down, not through
 * classes, modules or large dicts such as a module's globals), candidates for the rest of
 * the cycles through them wherever the collector's lists put those. */
enum { kNearDepth = 4, kNearObjects = 4096, kNearDictSize = 64 };

typedef struct {
  Members* members;
  Members* near;
} Near;

static int VisitNear(PyObject* op, void* arg) {
  Near* n = (Near*)arg;
  if (!PyObject_IS_GC(op) || PyType_Check(op) || PyModule_Check(op)) return 0;
  if (PyDict_Check(op) && PyDict_GET_SIZE(op) > kNearDictSize) return 0;
  if (Find(n->members, op) >= 0 || Find(n->near, op) >= 0) return 0;
  return Add(n->near, op, -1) < 0; /* full: stop */
}

/* Adds the near objects that refer to a member, until none does (each costs a traversal of
 * a near object, not a pass over the heap). Returns how many joined (position -1: the caller
 * finds them in `objects`); -1 when the member bound was reached or memory ran out. */
static Py_ssize_t JoinCyclesForward(Members* s) {
  Members near;
  if (Init(&near, kNearObjects) < 0) {
    Free(&near);
    return -1;
  }
  Near n = {s, &near};
  Py_ssize_t level_start = 0, level_end = 0;
  for (Py_ssize_t m = 0; m < s->count; ++m) Traverse(s->members[m], VisitNear, &n);
  for (int depth = 1; depth < kNearDepth && near.count < near.capacity; ++depth) {
    level_start = level_end;
    level_end = near.count;
    for (Py_ssize_t i = level_start; i < level_end && near.count < near.capacity; ++i) {
      Traverse(near.members[i], VisitNear, &n);
    }
  }
  Py_ssize_t before = s->count;
  int changed = 1, full = 0;
  char* joined = (char*)calloc((size_t)near.count + 1, 1);
  if (joined == NULL) full = 1;
  while (changed && !full) {
    changed = 0;
    for (Py_ssize_t i = 0; i < near.count && !full; ++i) {
      if (joined[i] || !Traverse(near.members[i], VisitIsMember, s)) continue;
      if (Add(s, near.members[i], -1) < 0) full = 1;
      joined[i] = 1;
      changed = 1;
    }
  }
  free(joined);
  Free(&near);
  return full ? -1 : s->count - before;
}

PyObject* TorchmemInstancesOf(PyObject* objects, PyObject* type) {
  if (!PyList_Check(objects) || !PyType_Check(type)) {
    PyErr_SetString(PyExc_TypeError, "instances_of(list, type)");
    return NULL;
  }
  PyObject* found = PyList_New(0);
  if (found == NULL) return NULL;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(objects); ++i) {
    PyObject* op = PyList_GET_ITEM(objects, i);
    if (PyObject_TypeCheck(op, (PyTypeObject*)type) && PyList_Append(found, op) < 0) {
      Py_DECREF(found);
      return NULL;
    }
  }
  return found;
}

/* Step 2 on the members so far: 1 in `reachable[m]` for each member something outside
 * reaches, as gc_collect_main's update_refs, subtract_refs and move_unreachable. Returns
 * whether every seed (the first `seed_count` members) is unreachable. */
static int MarkReachable(Members* s, PyObject* seeds, char* reachable, Py_ssize_t* stack) {
  for (Py_ssize_t m = 0; m < s->count; ++m) {
    /* `objects` holds one reference to each member it lists; `seeds` one to each seed. */
    s->outside[m] = Py_REFCNT(s->members[m]) - (s->position[m] >= 0 ? 1 : 0);
    reachable[m] = 0;
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(seeds); ++i)
    --s->outside[Find(s, PyList_GET_ITEM(seeds, i))];
  for (Py_ssize_t m = 0; m < s->count; ++m) Traverse(s->members[m], VisitSubtract, s);
  Reach r = {s, reachable, stack, 0};
  for (Py_ssize_t m = 0; m < s->count; ++m) {
    /* Not seen in `objects` (untracked, or frozen): what refers to it is unknown. */
    if ((s->outside[m] > 0 || s->position[m] < 0) && !reachable[m]) {
      reachable[m] = 1;
      stack[r.depth++] = m;
    }
  }
  while (r.depth > 0) Traverse(s->members[stack[--r.depth]], VisitReach, &r);
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(seeds); ++i) {
    if (reachable[Find(s, PyList_GET_ITEM(seeds, i))]) return 0;
  }
  return 1;
}

PyObject* TorchmemSubsetGarbage(PyObject* objects, PyObject* seeds, Py_ssize_t max_passes,
                                Py_ssize_t max_members) {
  if (!PyList_Check(objects) || !PyList_Check(seeds)) {
    PyErr_SetString(PyExc_TypeError, "subset_garbage(list, list, int, int)");
    return NULL;
  }
  Py_ssize_t n = PyList_GET_SIZE(objects);
  Py_ssize_t bound = max_members < PyList_GET_SIZE(seeds) ? PyList_GET_SIZE(seeds) : max_members;
  Members s;
  char* reachable = (char*)calloc((size_t)bound + 1, 1);
  Py_ssize_t* stack = (Py_ssize_t*)malloc(((size_t)bound + 1) * sizeof(Py_ssize_t));
  if (Init(&s, bound) < 0 || reachable == NULL || stack == NULL) {
    Free(&s);
    free(reachable);
    free(stack);
    return PyErr_NoMemory();
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(seeds); ++i) {
    PyObject* op = PyList_GET_ITEM(seeds, i);
    if (Find(&s, op) < 0) Add(&s, op, -1);
  }
  /* Step 1, pass by pass, and step 2 after each: any S is a correct one, so the passes stop
   * as soon as every seed is garbage. Directions alternate: a chain of holders laid out in
   * either order in the collector's lists joins in one pass. */
  int complete = 0, full = 0, decided = 0;
  Py_ssize_t passes = 0;
  while (passes < max_passes && !complete && !full && !decided) {
    Py_ssize_t added = 0;
    int forward = passes % 2 == 0;
    for (Py_ssize_t k = 0; k < n && !full; ++k) {
      Py_ssize_t i = forward ? k : n - 1 - k;
      PyObject* op = PyList_GET_ITEM(objects, i);
      /* The caller's own lists (gc.get_objects of the youngest generation lists `objects`). */
      if (op == objects || op == seeds) continue;
      Py_ssize_t member = Find(&s, op);
      if (member >= 0) {
        s.position[member] = i;
        continue;
      }
      if (Traverse(op, VisitIsMember, &s)) {
        if (Add(&s, op, i) < 0)
          full = 1;
        else
          ++added;
      }
    }
    ++passes;
    complete = added == 0 && !full;
    if (!full) {
      Py_ssize_t joined = JoinCyclesForward(&s);
      if (joined < 0) {
        full = 1;
      } else if (joined > 0) {
        complete = 0;
        for (Py_ssize_t i = 0; i < n; ++i) { /* their positions: no traversal, a lookup each */
          Py_ssize_t member = Find(&s, PyList_GET_ITEM(objects, i));
          if (member >= 0) s.position[member] = i;
        }
      }
    }
    decided = MarkReachable(&s, seeds, reachable, stack);
  }
  if (passes == 0) MarkReachable(&s, seeds, reachable, stack);
  /* The garbage in `objects`' order (what a collection's unreachable list keeps). */
  char* garbage_at = (char*)calloc((size_t)n + 1, 1);
  PyObject* garbage = garbage_at == NULL ? NULL : PyList_New(0);
  Py_ssize_t finalizers = 0;
  if (garbage != NULL) {
    for (Py_ssize_t m = 0; m < s.count; ++m) {
      if (reachable[m]) continue;
      garbage_at[s.position[m]] = 1;
      /* What a collection would run on it: __del__ (tp_finalize, once) or a legacy tp_del. */
      PyTypeObject* type = Py_TYPE(s.members[m]);
      if ((type->tp_finalize != NULL && !PyObject_GC_IsFinalized(s.members[m])) ||
          type->tp_del != NULL) {
        ++finalizers;
      }
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (garbage_at[i] && PyList_Append(garbage, PyList_GET_ITEM(objects, i)) < 0) {
        Py_CLEAR(garbage);
        break;
      }
    }
  }
  Py_ssize_t members = s.count;
  free(garbage_at);
  free(reachable);
  free(stack);
  Free(&s);
  if (garbage == NULL) return PyErr_Occurred() ? NULL : PyErr_NoMemory();
  return Py_BuildValue("(NOnnn)", garbage, complete ? Py_True : Py_False, passes, members,
                       finalizers);
}

PyObject* TorchmemUnreachableAmong(PyObject* objects) {
  if (!PyList_Check(objects)) {
    PyErr_SetString(PyExc_TypeError, "unreachable_among(list)");
    return NULL;
  }
  Py_ssize_t n = PyList_GET_SIZE(objects);
  Members s;
  char* reachable = (char*)calloc((size_t)n + 1, 1);
  Py_ssize_t* stack = (Py_ssize_t*)malloc(((size_t)n + 1) * sizeof(Py_ssize_t));
  PyObject* no_seeds = PyList_New(0);
  if (Init(&s, n + 1) < 0 || reachable == NULL || stack == NULL || no_seeds == NULL) {
    Free(&s);
    free(reachable);
    free(stack);
    Py_XDECREF(no_seeds);
    return PyErr_Occurred() ? NULL : PyErr_NoMemory();
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* op = PyList_GET_ITEM(objects, i);
    if (op != objects && Find(&s, op) < 0) Add(&s, op, i);
  }
  /* Every member is in `objects`: step 2 alone, with nothing to discount but that list. */
  MarkReachable(&s, no_seeds, reachable, stack);
  Py_DECREF(no_seeds);
  PyObject* garbage = PyList_New(0);
  for (Py_ssize_t m = 0; garbage != NULL && m < s.count; ++m) {
    if (!reachable[m] && PyList_Append(garbage, s.members[m]) < 0) Py_CLEAR(garbage);
  }
  free(reachable);
  free(stack);
  Free(&s);
  return garbage;
}

PyObject* TorchmemTypesOf(PyObject* objects) {
  if (!PyList_Check(objects)) {
    PyErr_SetString(PyExc_TypeError, "types_of(list)");
    return NULL;
  }
  PyObject* types = PySet_New(NULL);
  PyTypeObject* last = NULL; /* neighbours often share a type: skip the set's lookup */
  for (Py_ssize_t i = 0; types != NULL && i < PyList_GET_SIZE(objects); ++i) {
    PyTypeObject* type = Py_TYPE(PyList_GET_ITEM(objects, i));
    if (type == last) continue;
    last = type;
    if (PySet_Add(types, (PyObject*)type) < 0) Py_CLEAR(types);
  }
  return types;
}

PyObject* TorchmemObjectsOfTypes(PyObject* objects, PyObject* types) {
  if (!PyList_Check(objects) || !PyAnySet_Check(types)) {
    PyErr_SetString(PyExc_TypeError, "objects_of_types(list, set)");
    return NULL;
  }
  PyObject* found = PyList_New(0);
  for (Py_ssize_t i = 0; found != NULL && i < PyList_GET_SIZE(objects); ++i) {
    PyObject* op = PyList_GET_ITEM(objects, i);
    int wanted = PySet_Contains(types, (PyObject*)Py_TYPE(op));
    if (wanted < 0 || (wanted && PyList_Append(found, op) < 0)) Py_CLEAR(found);
  }
  return found;
}

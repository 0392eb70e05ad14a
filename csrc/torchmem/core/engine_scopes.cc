// Engine: leak-check scopes. A block allocated under an open scope is linked
// into that scope's list (ScopeBlocks) until it becomes free; when the scope
// closes, its survivors are reported and handed to the enclosing scope.
#include <algorithm>
#include <memory>
#include <utility>

#include "torchmem/core/attribution.h"
#include "torchmem/core/engine.h"

namespace torchmem {

ScopeBlocks* Engine::ScopeListFor(ScopeId scope) {
  if (last_scope_ != nullptr && last_scope_->scope == scope) return last_scope_;
  auto it = scopes_.find(scope);
  if (it == scopes_.end()) {
    // A thread may still carry a scope that closed (e.g. propagated state
    // of a finished region): such allocations are tracked by no scope.
    if (!IsScopeOpen(scope)) return nullptr;
    auto list = std::make_unique<ScopeBlocks>();
    list->scope = scope;
    it = scopes_.emplace(scope, std::move(list)).first;
  }
  last_scope_ = it->second.get();
  return last_scope_;
}

void Engine::LinkToScope(Block* block, ScopeBlocks* list) {
  block->scope_list = list;
  block->list_prev = nullptr;
  block->list_next = list->head;
  if (list->head != nullptr) list->head->list_prev = block;
  list->head = block;
  ++list->blocks;
}

void Engine::UnlinkFromScope(Block* block) {
  ScopeBlocks* list = block->scope_list;
  if (list == nullptr) return;
  if (block->list_prev != nullptr) {
    block->list_prev->list_next = block->list_next;
  } else {
    list->head = block->list_next;
  }
  if (block->list_next != nullptr) block->list_next->list_prev = block->list_prev;
  block->scope_list = nullptr;
  block->list_prev = block->list_next = nullptr;
  --list->blocks;
}

ScopeSurvivors Engine::CollectScope(ScopeId scope, ScopeId parent) {
  ScopeSurvivors survivors;
  survivors.device = device_name_;
  MutexLock lock(&mutex_);
  auto it = scopes_.find(scope);
  if (it == scopes_.end()) return survivors;
  std::unique_ptr<ScopeBlocks> list = std::move(it->second);
  scopes_.erase(it);
  if (last_scope_ == list.get()) last_scope_ = nullptr;
  ScopeBlocks* target = parent == kNoScope ? nullptr : ScopeListFor(parent);
  for (Block* block = list->head; block != nullptr;) {
    Block* next = block->list_next;
    (block->state == BlockState::kAllocated ? survivors.allocated : survivors.pending)
        .push_back(DescribeBlock(*block));
    block->scope_list = nullptr;
    block->list_prev = block->list_next = nullptr;
    if (target != nullptr) LinkToScope(block, target);
    block = next;
  }
  auto by_sequence = [](const BlockInfo& a, const BlockInfo& b) { return a.sequence < b.sequence; };
  std::sort(survivors.allocated.begin(), survivors.allocated.end(), by_sequence);
  std::sort(survivors.pending.begin(), survivors.pending.end(), by_sequence);
  return survivors;
}

}  // namespace torchmem

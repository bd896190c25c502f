using System;
using System.Collections.Generic;

namespace Samples
{
    /// <summary>Least-recently-used cache with a fixed capacity.</summary>
    public sealed class LruCache<TKey, TValue> where TKey : notnull
    {
        private readonly int capacity;
        private readonly Dictionary<TKey, LinkedListNode<(TKey Key, TValue Value)>> map = new();
        private readonly LinkedList<(TKey Key, TValue Value)> order = new();

        public LruCache(int capacity)
        {
            if (capacity <= 0) throw new ArgumentOutOfRangeException(nameof(capacity));
            this.capacity = capacity;
        }

        public bool TryGet(TKey key, out TValue value)
        {
            if (map.TryGetValue(key, out var node))
            {
                order.Remove(node);
                order.AddFirst(node);
                value = node.Value.Value;
                return true;
            }
            value = default!;
            return false;
        }

        public void Put(TKey key, TValue value)
        {
            if (map.TryGetValue(key, out var existing))
            {
                order.Remove(existing);
            }
            else if (map.Count == capacity)
            {
                var last = order.Last!;
                order.RemoveLast();
                map.Remove(last.Value.Key);
            }
            map[key] = order.AddFirst((key, value));
        }
    }
}

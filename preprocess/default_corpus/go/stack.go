package sample

import "errors"

// ErrEmpty is returned by Pop on an empty stack.
var ErrEmpty = errors.New("stack is empty")

// Stack is a LIFO stack of ints.
type Stack struct {
	items []int
}

// Push adds v on top.
func (s *Stack) Push(v int) {
	s.items = append(s.items, v)
}

// Pop removes and returns the top value.
func (s *Stack) Pop() (int, error) {
	if len(s.items) == 0 {
		return 0, ErrEmpty
	}
	v := s.items[len(s.items)-1]
	s.items = s.items[:len(s.items)-1]
	return v, nil
}

// EvalRPN evaluates a reverse Polish expression of integers and + - *.
func EvalRPN(tokens []string, atoi func(string) (int, error)) (int, error) {
	var s Stack
	for _, t := range tokens {
		switch t {
		case "+", "-", "*":
			b, err := s.Pop()
			if err != nil {
				return 0, err
			}
			a, err := s.Pop()
			if err != nil {
				return 0, err
			}
			switch t {
			case "+":
				s.Push(a + b)
			case "-":
				s.Push(a - b)
			default:
				s.Push(a * b)
			}
		default:
			v, err := atoi(t)
			if err != nil {
				return 0, err
			}
			s.Push(v)
		}
	}
	return s.Pop()
}
